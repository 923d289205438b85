//! Embeds the repository's recipes so `mindxtrain demo` runs on a fresh machine with
//! nothing but the binary.

use std::fmt::Write;
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    files.retain(|p: &std::path::PathBuf| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    let mut src = String::from(
        "/// Recipes from `recipes/`, embedded at build time: (file name, text).\npub const EMBEDDED_RECIPES: &[(&str, &str)] = &[\n",
    );
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let _ = writeln!(
            src,
            "    ({name:?}, include_str!({:?})),",
            f.canonicalize().unwrap_or(f.clone()).display().to_string()
        );
    }
    src.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("embedded_recipes.rs");
    std::fs::write(out, src).expect("writing embedded_recipes.rs");
}
