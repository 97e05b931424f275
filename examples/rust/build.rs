// Links libvllm from the source tree's build/ (override with LIBVLLM_DIR) and bakes its
// directory into the binary's rpath.
use std::path::PathBuf;

fn main() {
    let dir = std::env::var("LIBVLLM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build"));
    let dir = dir
        .canonicalize()
        .expect("build libvllm first: make build/libvllm.so");
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=vllm");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    println!("cargo:rerun-if-env-changed=LIBVLLM_DIR");
}
