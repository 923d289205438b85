//! Deleting any single line of a valid recipe either leaves a valid recipe or yields errors
//! located inside the file: never a panic, never an unlocated error.

mod common;

use std::path::Path;

use mindxtrain_trainer::recipe::Recipe;

fn delete_each_line(name: &str, src: &str) -> (usize, usize) {
    let lines: Vec<&str> = src.lines().collect();
    let (mut still_valid, mut rejected) = (0, 0);
    for skip in 0..lines.len() {
        let mutated: String =
            lines.iter().enumerate().filter(|(i, _)| *i != skip).map(|(_, l)| format!("{l}\n")).collect();
        let count = mutated.lines().count().max(1);
        match Recipe::check_str(&mutated, name) {
            Ok(_) => still_valid += 1,
            Err(errors) => {
                rejected += 1;
                for e in errors.iter() {
                    let loc = e.location().unwrap_or_else(|| panic!("unlocated after deleting line {}: {e}", skip + 1));
                    assert!(
                        (1..=count + 1).contains(&loc.line) && loc.column >= 1,
                        "{name}: deleting line {} gave {e}, outside {count} lines",
                        skip + 1
                    );
                }
            }
        }
    }
    (still_valid, rejected)
}

#[test]
fn deleting_any_line_of_any_shipped_recipe() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes");
    let mut total_rejected = 0;
    for entry in std::fs::read_dir(dir).expect("recipes/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let src = std::fs::read_to_string(&path).expect("utf-8 recipe");
        let (_, rejected) = delete_each_line(&path.display().to_string(), &src);
        total_rejected += rejected;
    }
    assert!(total_rejected > 0, "some deletion must break some recipe");
}

#[test]
fn deleting_any_line_of_the_base_recipe() {
    let (valid, rejected) = delete_each_line("base.yaml", common::BASE);
    // Required keys (run_name, gpus, kind, every env key...) must be missed when deleted.
    assert!(rejected >= 15, "{rejected} rejected, {valid} still valid");
}
