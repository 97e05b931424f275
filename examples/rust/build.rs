// Finds libvllm through pkg-config (`pkg-config --libs libvllm`): an installed one
// (make install, or pip install with PKG_CONFIG_PATH=$(python -m libvllm.capi --pkg-config-path)),
// else this checkout's build/ (its libvllm.pc), and bakes the library's folder into the
// binary's rpath. No crates: pkg-config is run as a program.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let checkout = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../build");
    let mut search = std::env::var("PKG_CONFIG_PATH").unwrap_or_default();
    if !search.is_empty() {
        search.push(':');
    }
    search.push_str(&checkout.display().to_string()); // the fallback: a checkout's build
    let output = Command::new("pkg-config")
        .args(["--libs", "libvllm"])
        .env("PKG_CONFIG_PATH", &search)
        .output()
        .expect("pkg-config is needed to find libvllm");
    if !output.status.success() {
        panic!(
            "pkg-config found no libvllm (make build/libvllm.so, or set PKG_CONFIG_PATH): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    for flag in String::from_utf8_lossy(&output.stdout).split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={dir}");
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    }
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
}
