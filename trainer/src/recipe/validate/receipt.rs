//! Rules for the `receipt` section's output path.

use super::{Checks, Recipe};
use crate::run::{DEFAULT_RECEIPT_FILE, RUN_FILES};
use std::path::{Component, Path};

/// `receipt.output` names a file, and, relative to the run directory, not one of the run's own
/// files or directories: the node writes the receipt after sealing, over whatever is there.
pub(super) fn output(c: &mut Checks, r: &Recipe) {
    const AT: &str = "receipt.output";
    let Some(out) = r.receipt.output.as_deref().filter(|o| !o.trim().is_empty()) else { return };
    let path = Path::new(out);
    if out.ends_with('/') || path.file_name().is_none() {
        c.fail(AT, format!("{out:?} names a directory: give the receipt's file path (default {DEFAULT_RECEIPT_FILE})"));
        return;
    }
    if path.is_absolute() {
        return;
    }
    // The first part that is not `.`: a `..` leaves the run directory, which may hold anything.
    let first = path.components().find(|part| !matches!(part, Component::CurDir));
    if let Some(Component::Normal(name)) = first
        && let name = name.to_string_lossy()
        && RUN_FILES.contains(&name.as_ref())
        && out != DEFAULT_RECEIPT_FILE
    {
        c.fail(
            AT,
            format!(
                "{out:?} is inside the run's own `{name}`: the receipt, written after sealing, would replace or join \
                 the run's files; use {DEFAULT_RECEIPT_FILE} (the default), a name of its own in the run directory, \
                 or a path outside it"
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::recipe::Recipe;

    const LORA: &str = include_str!("../../../../recipes/tiny_cpu_lora.yaml");

    /// The errors of the shipped LoRA recipe with `receipt.output: {out}`, as shown.
    fn errors(out: &str) -> Vec<String> {
        let src = format!("{LORA}\nreceipt:\n  output: {out}\n");
        match Recipe::check_str(&src, "r.yaml") {
            Ok(_) => vec![],
            Err(errs) => errs.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn a_receipt_output_over_the_runs_own_files_is_refused_where_it_is_written() {
        for ok in ["receipt.json", "sub/r.json", "./receipts/r.json", "../elsewhere/run.json", "/abs/final/r.json"] {
            assert_eq!(errors(ok), Vec::<String>::new(), "{ok}");
        }
        for bad in ["run.json", "final/receipt.json", "./checkpoints/r.json", "plan.json"] {
            let e = errors(bad);
            assert!(e.len() == 1 && e[0].contains("receipt.output") && e[0].contains("run's own"), "{bad}: {e:?}");
        }
        let e = errors("receipts/");
        assert!(e.len() == 1 && e[0].contains("names a directory"), "{e:?}");
    }
}
