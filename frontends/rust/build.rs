//! Finds libshardkit.so, in this order:
//!   1. SK_LIB_DIR, if set (the Bazel tests set it to the library they built;
//!      before 0.8.0 SHARDKIT_LIB_DIR, still read when SK_LIB_DIR is unset);
//!   2. `pkg-config --variable=libdir shardkit` (an installed library:
//!      `bazel run //:install -- --prefix=DIR`, with DIR/lib/pkgconfig on
//!      PKG_CONFIG_PATH);
//!   3. the Bazel output directory of the checkout this crate sits in.
//! The crate's own tests and examples get an rpath to that directory, so they
//! run without LD_LIBRARY_PATH. A program of yours that depends on this crate
//! reads the directory from DEP_SHARDKIT_LIBDIR in its own build.rs and adds
//! the same rpath: `println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir)`.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn pkg_config_libdir() -> Option<PathBuf> {
    let out = Command::new("pkg-config").args(["--variable=libdir", "shardkit"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8(out.stdout).ok()?.trim().to_string();
    if dir.is_empty() {
        None
    } else {
        Some(PathBuf::from(dir))
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=SK_LIB_DIR");
    println!("cargo:rerun-if-env-changed=SHARDKIT_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-changed=build.rs");
    let set = |name: &str| env::var_os(name).filter(|v| !v.is_empty());
    let dir = match set("SK_LIB_DIR").or_else(|| set("SHARDKIT_LIB_DIR")) {
        Some(d) => PathBuf::from(d),
        None => match pkg_config_libdir() {
            Some(d) => d,
            None => {
                let manifest =
                    PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
                let checkout = manifest.join("../../bazel-bin/capi");
                if !checkout.join("libshardkit.so").exists() {
                    panic!(
                        "libshardkit.so not found: set SK_LIB_DIR, or install shardkit \
                         (bazel run //:install -- --prefix=DIR) and put DIR/lib/pkgconfig on \
                         PKG_CONFIG_PATH, or build it in this checkout (bazel build //capi:libshardkit.so)"
                    );
                }
                checkout
            }
        },
    };
    let dir = dir.canonicalize().unwrap_or(dir);
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=shardkit");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    // For crates that depend on this one (links = "shardkit"): DEP_SHARDKIT_LIBDIR.
    println!("cargo:libdir={}", dir.display());
}
