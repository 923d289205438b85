//! Learning-rate schedules with warmup, the formulas of HF transformers'
//! `get_{constant,linear,cosine}_schedule_with_warmup`, `get_cosine_with_min_lr_schedule_with_warmup`
//! and `get_wsd_schedule`, evaluated like its `LambdaLR`: the update number `step` (0-based,
//! the count of updates already taken) uses `lr * factor(step)`, so with warmup the first
//! update has learning rate 0, as in HF `Trainer`.
//!
//! From the recipe: warmup steps are `ceil(total * warmup_ratio)` (HF `get_warmup_steps`);
//! `wsd` decays over `ceil(total * decay_ratio)` steps with HF's default cosine decay and its
//! stable phase fills the rest. `min_lr_ratio` is HF's `min_lr_rate` for cosine and its
//! `min_lr_ratio` for wsd; linear applies the same `factor * (1 - min) + min` (HF's linear has
//! no floor, the two agree at 0); constant ignores it.

use std::f64::consts::PI;

use super::OptimError;
use crate::recipe::{Optimizer, Schedule, ScheduleKind};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Warmup {
    Steps(u64),
    /// Fraction of the total steps, rounded up.
    Ratio(f64),
}

#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    kind: ScheduleKind,
    base_lr: f64,
    total_steps: u64,
    warmup_steps: u64,
    min_lr_ratio: f64,
    /// `wsd` only.
    decay_steps: u64,
}

impl LrSchedule {
    /// `decay_ratio` is read only by `wsd`.
    pub fn new(
        kind: ScheduleKind,
        base_lr: f64,
        total_steps: u64,
        warmup: Warmup,
        min_lr_ratio: f64,
        decay_ratio: f64,
    ) -> Result<Self, OptimError> {
        let bad = |m: String| Err(OptimError::Schedule(m));
        if !(base_lr.is_finite() && base_lr >= 0.0) {
            return bad(format!("learning rate must be finite and >= 0, got {base_lr}"));
        }
        if total_steps == 0 {
            return bad("total steps must be > 0".into());
        }
        for (what, r) in [("min_lr_ratio", min_lr_ratio), ("decay_ratio", decay_ratio)] {
            if !(0.0..=1.0).contains(&r) {
                return bad(format!("{what} must be in [0, 1], got {r}"));
            }
        }
        let warmup_steps = match warmup {
            Warmup::Steps(s) => s,
            Warmup::Ratio(r) if (0.0..=1.0).contains(&r) => ratio_steps(total_steps, r),
            Warmup::Ratio(r) => return bad(format!("warmup_ratio must be in [0, 1], got {r}")),
        };
        if warmup_steps > total_steps {
            return bad(format!("{warmup_steps} warmup steps exceed the {total_steps} total"));
        }
        let decay_steps = if kind == ScheduleKind::Wsd { ratio_steps(total_steps, decay_ratio) } else { 0 };
        if warmup_steps + decay_steps > total_steps {
            return bad(format!(
                "wsd: {warmup_steps} warmup + {decay_steps} decay steps exceed the {total_steps} total"
            ));
        }
        Ok(LrSchedule { kind, base_lr, total_steps, warmup_steps, min_lr_ratio, decay_steps })
    }

    pub fn from_recipe(optimizer: &Optimizer, schedule: &Schedule, total_steps: u64) -> Result<Self, OptimError> {
        Self::new(
            schedule.kind,
            optimizer.lr,
            total_steps,
            Warmup::Ratio(schedule.warmup_ratio),
            schedule.min_lr_ratio,
            schedule.decay_ratio,
        )
    }

    pub fn warmup_steps(&self) -> u64 {
        self.warmup_steps
    }

    pub fn total_steps(&self) -> u64 {
        self.total_steps
    }

    /// Learning rate of update number `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        self.base_lr * self.factor(step)
    }

    /// The multiplier of the base learning rate at update number `step`.
    pub fn factor(&self, step: u64) -> f64 {
        let (w, total, min) = (self.warmup_steps, self.total_steps, self.min_lr_ratio);
        let floor = |f: f64| f * (1.0 - min) + min;
        if self.kind == ScheduleKind::Wsd {
            return self.wsd_factor(step);
        }
        if step < w {
            return step as f64 / w.max(1) as f64;
        }
        match self.kind {
            ScheduleKind::Constant => 1.0,
            ScheduleKind::Linear => {
                let f = total.saturating_sub(step) as f64 / total.saturating_sub(w).max(1) as f64;
                floor(f).max(0.0)
            }
            ScheduleKind::Cosine => {
                let progress = (step - w) as f64 / total.saturating_sub(w).max(1) as f64;
                floor(0.5 * (1.0 + (PI * 0.5 * 2.0 * progress).cos())).max(0.0)
            }
            ScheduleKind::Wsd => unreachable!("handled above"),
        }
    }

    fn wsd_factor(&self, step: u64) -> f64 {
        let (w, d, min) = (self.warmup_steps, self.decay_steps, self.min_lr_ratio);
        let stable = self.total_steps - w - d;
        if step < w {
            let progress = step as f64 / w.max(1) as f64;
            return (progress * (1.0 - min) + min).max(0.0);
        }
        if step < w + stable {
            return 1.0;
        }
        if step < w + stable + d {
            let progress = (step - w - stable) as f64 / d.max(1) as f64;
            let f = 0.5 * (1.0 + (PI * 0.5 * 2.0 * progress).cos());
            return (f * (1.0 - min) + min).max(0.0);
        }
        min
    }
}

fn ratio_steps(total: u64, ratio: f64) -> u64 {
    (total as f64 * ratio).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(kind: ScheduleKind, total: u64, warmup: u64, min: f64, decay: f64) -> LrSchedule {
        LrSchedule::new(kind, 2.0, total, Warmup::Steps(warmup), min, decay).unwrap()
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }

    #[test]
    fn warmup_is_linear_from_zero() {
        for kind in [ScheduleKind::Constant, ScheduleKind::Linear, ScheduleKind::Cosine] {
            let s = sched(kind, 100, 4, 0.0, 0.0);
            assert_eq!([s.factor(0), s.factor(1), s.factor(2), s.factor(3)], [0.0, 0.25, 0.5, 0.75]);
            assert_eq!(s.factor(4), 1.0);
            assert_eq!(s.lr(2), 1.0);
        }
    }

    #[test]
    fn constant_stays() {
        let s = sched(ScheduleKind::Constant, 10, 0, 0.5, 0.0);
        assert!((0..20).all(|t| s.factor(t) == 1.0));
    }

    #[test]
    fn linear_decays_to_zero_at_total() {
        // HF: max(0, (total - step) / max(1, total - warmup)), here total 10, warmup 2.
        let s = sched(ScheduleKind::Linear, 10, 2, 0.0, 0.0);
        close(s.factor(2), 1.0);
        close(s.factor(6), 0.5);
        close(s.factor(9), 0.125);
        close(s.factor(10), 0.0);
        close(s.factor(15), 0.0);
        let floored = sched(ScheduleKind::Linear, 10, 2, 0.2, 0.0);
        close(floored.factor(6), 0.5 * 0.8 + 0.2);
        close(floored.factor(10), 0.2);
    }

    #[test]
    fn cosine_half_wave() {
        // progress = (step - 2) / 8: 0 -> 1, 0.25 -> (1 + cos(pi/4))/2, 0.5 -> 0.5, 1 -> 0.
        let s = sched(ScheduleKind::Cosine, 10, 2, 0.0, 0.0);
        close(s.factor(2), 1.0);
        close(s.factor(4), 0.5 * (1.0 + std::f64::consts::FRAC_1_SQRT_2));
        close(s.factor(6), 0.5);
        close(s.factor(10), 0.0);
        // Past the end the cosine comes back up; HF does not clamp progress, neither do we.
        close(s.factor(14), 0.5);
        let m = sched(ScheduleKind::Cosine, 10, 2, 0.1, 0.0);
        close(m.factor(6), 0.5 * 0.9 + 0.1);
        close(m.factor(10), 0.1);
    }

    #[test]
    fn wsd_warms_holds_and_decays() {
        // total 20, warmup 2, decay ceil(20 * 0.25) = 5, stable 13: steps 2..15 at 1.
        let s = sched(ScheduleKind::Wsd, 20, 2, 0.1, 0.25);
        close(s.factor(0), 0.1); // HF's wsd warmup starts at the floor
        close(s.factor(1), 0.5 * 0.9 + 0.1);
        assert!((2..15).all(|t| s.factor(t) == 1.0));
        close(s.factor(15), 1.0);
        close(s.factor(17), (0.5 * (1.0 + (PI * 0.4).cos())) * 0.9 + 0.1);
        close(s.factor(20), 0.1);
        close(s.factor(99), 0.1);
    }

    #[test]
    fn recipe_ratios_round_up_like_hf() {
        let schedule = Schedule { kind: ScheduleKind::Cosine, warmup_ratio: 0.03, min_lr_ratio: 0.0, decay_ratio: 0.1 };
        let s = LrSchedule::from_recipe(&Optimizer::default(), &schedule, 101).unwrap();
        assert_eq!(s.warmup_steps(), 4); // ceil(3.03)
        close(s.lr(2), 1e-4 * 0.5);
    }

    #[test]
    fn invalid_settings_are_errors() {
        use ScheduleKind::*;
        assert!(LrSchedule::new(Cosine, 1.0, 0, Warmup::Steps(0), 0.0, 0.0).is_err());
        assert!(LrSchedule::new(Cosine, 1.0, 10, Warmup::Steps(11), 0.0, 0.0).is_err());
        assert!(LrSchedule::new(Cosine, 1.0, 10, Warmup::Ratio(1.5), 0.0, 0.0).is_err());
        assert!(LrSchedule::new(Cosine, f64::NAN, 10, Warmup::Steps(0), 0.0, 0.0).is_err());
        assert!(LrSchedule::new(Wsd, 1.0, 10, Warmup::Steps(5), 0.0, 0.6).is_err());
        assert!(LrSchedule::new(Linear, 1.0, 10, Warmup::Steps(0), 1.5, 0.0).is_err());
    }
}
