//! Compiles runtime-min's `kernels.cu` as C++ for the host, through `host_shim.h`, after
//! the operation codes' `#define`s and the kernels' prototypes, written here from the
//! tables both languages read (`op_codes.rs`, `kernel_table.rs`).

include!("../src/cuda/op_codes.rs");
include!("../src/cuda/kernel_table.rs");

fn main() {
    println!("cargo:rerun-if-changed=../src/cuda/kernels.cu");
    println!("cargo:rerun-if-changed=../src/cuda/op_codes.rs");
    println!("cargo:rerun-if-changed=../src/cuda/kernel_table.rs");
    println!("cargo:rerun-if-changed=host_shim.h");
    println!("cargo:rerun-if-changed=kernels_host.cpp");
    let generated = std::path::PathBuf::from(
        std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR for build scripts"),
    );
    std::fs::write(generated.join("kernel_header.h"), c_kernel_header!())
        .expect("write kernel_header.h into OUT_DIR");
    cc::Build::new()
        .cpp(true)
        .file("kernels_host.cpp")
        .include(".")
        .include(&generated)
        .include("../src/cuda")
        .flag_if_supported("-std=c++17")
        .flag_if_supported("-ffp-contract=off")
        .warnings(false)
        // The kernels run whole models in the tests: optimize them even in debug builds.
        .opt_level(3)
        .compile("ralpc_kernels_host");
}
