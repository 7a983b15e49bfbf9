//! Finds libshardkit.so: SHARDKIT_LIB_DIR if set (the Bazel test sets it to
//! the freshly built library), else the Bazel output directory of this
//! checkout. Test binaries and examples get an rpath to that directory, so
//! they run without LD_LIBRARY_PATH.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=SHARDKIT_LIB_DIR");
    println!("cargo:rerun-if-changed=build.rs");
    let dir = match env::var_os("SHARDKIT_LIB_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
            manifest.join("../../bazel-bin/capi")
        }
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=shardkit");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
}
