//! The partition search (`plan::plan`, family `auto`: every family), on the three
//! planning-time cases: VGG16 (ONNX) on 8 GPUs, PipeDream's ResNet-50 graph on 8, and a
//! generated branchy 1,000-layer graph on 1,024 GPUs (128 DGX A100 nodes).
//!
//! `cargo bench -p ralpc-passes --bench plan` (add `-- --threads 1` for one core). The
//! whole-process times (loading included) are measured by `scripts/bench-plan.sh`.

use std::path::Path;

use ralpc_passes::cluster::{Cluster, Link};
use ralpc_passes::layers::LayerGraph;
use ralpc_passes::plan::{self, CostOptions, Costs, Request};
use ralpc_passes::profile::{self, Loaded};

fn main() {
    divan::main();
}

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn vgg16() -> LayerGraph {
    let mut model =
        ralpc_ir::onnx::import(&repo("fixtures/onnx/vgg16/model.onnx")).expect("imports");
    let bindings = ralpc_ir::Bindings {
        batch: Some(32),
        ..Default::default()
    };
    ralpc_ir::bind(&mut model.graph, &bindings).expect("binds");
    let info = ralpc_ir::verify(&model.graph).expect("verifies");
    ralpc_passes::layers::build(&model.graph, &info, 32, Default::default()).expect("builds")
}

fn search(bencher: divan::Bencher, graph: &LayerGraph, cluster: &Cluster, gpus: u32) {
    bencher.bench(|| {
        // A fresh cost model each time: its caches are part of the search's cost.
        let costs = Costs::new(graph, cluster, gpus, CostOptions::default());
        plan::plan(&costs, &Request::default())
            .expect("plans")
            .chosen
            .evaluation
            .iteration_time_us
    });
}

#[divan::bench(sample_count = 20)]
fn vgg16_on_8(bencher: divan::Bencher) {
    let graph = vgg16();
    let cluster = Cluster::preset("dgx-a100").expect("preset");
    search(bencher, &graph, &cluster, 8);
}

#[divan::bench(sample_count = 20)]
fn pipedream_resnet50_on_8(bencher: divan::Bencher) {
    let path = repo("fixtures/anchors/pipedream/resnet50/graph.txt");
    let Ok(Loaded::LayerGraph(g)) = profile::load(&path) else {
        panic!("{} is not a PipeDream graph", path.display());
    };
    let cluster = Cluster::preset("dgx-a100")
        .expect("preset")
        .with_flat_network(Link {
            latency_us: 0.0,
            bandwidth: 1e9,
        });
    search(bencher, &g.graph, &cluster, 8);
}

#[divan::bench(sample_count = 5)]
fn branchy_1000_on_1024(bencher: divan::Bencher) {
    let graph = ralpc_passes::synthetic::graph(1000, 2048, true, 7);
    let cluster = Cluster::preset("dgx-a100x128").expect("preset");
    search(bencher, &graph, &cluster, 1024);
}
