//! How many optimizer steps a run takes: `train.budget`.

use super::RunError;
use crate::recipe::Budget;

/// `budget.max_steps`, or the steps of `budget.epochs` passes over `rows` training rows (RL:
/// prompts) at `global_batch` rows per step, whichever comes first when both are set.
pub(super) fn total_steps(budget: &Budget, rows: u64, global_batch: u64) -> Result<u64, RunError> {
    let Some(epochs) = budget.epochs else {
        // `recipe check` requires one of the two.
        return Ok(budget.max_steps.unwrap_or(1));
    };
    if rows == 0 {
        return Err(RunError::Recipe("data: no training examples".into()));
    }
    let by_epochs = (u64::from(epochs) * rows).div_ceil(global_batch.max(1));
    Ok(budget.max_steps.map_or(by_epochs, |n| n.min(by_epochs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_stops_at_whichever_comes_first() {
        let budget = |epochs, max_steps| Budget { epochs, max_steps };
        // 100 rows, 8 a step: 13 steps an epoch.
        assert_eq!(total_steps(&budget(Some(2), None), 100, 8).unwrap(), 25);
        assert_eq!(total_steps(&budget(None, Some(7)), 100, 8).unwrap(), 7);
        assert_eq!(total_steps(&budget(Some(2), Some(7)), 100, 8).unwrap(), 7, "max_steps first");
        assert_eq!(total_steps(&budget(Some(1), Some(40)), 100, 8).unwrap(), 13, "the epoch first");
        assert!(total_steps(&budget(Some(1), None), 0, 8).is_err());
    }
}
