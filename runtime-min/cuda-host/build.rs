//! Compiles runtime-min's `kernels.cu` as C++ for the host, through `host_shim.h`.
fn main() {
    println!("cargo:rerun-if-changed=../src/cuda/kernels.cu");
    println!("cargo:rerun-if-changed=host_shim.h");
    println!("cargo:rerun-if-changed=kernels_host.cpp");
    cc::Build::new()
        .cpp(true)
        .file("kernels_host.cpp")
        .include(".")
        .include("../src/cuda")
        .flag_if_supported("-std=c++17")
        .flag_if_supported("-ffp-contract=off")
        .warnings(false)
        // The kernels run whole models in the tests: optimize them even in debug builds.
        .opt_level(3)
        .compile("ralpc_kernels_host");
}
