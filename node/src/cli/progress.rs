//! What `train` shows while it runs: a progress bar on a terminal, one plain line every N
//! steps when stderr is not one (nohup, CI, a scheduler), TensorBoard scalars when asked,
//! and a stop after the current step when interrupted.

use super::interrupt;
use indicatif::{ProgressBar, ProgressStyle};
use mindxtrain_node::training::{Hooks, PlanSource, UsedPlan, tensorboard::EventWriter};
use mindxtrain_trainer::run::{EvalReport, Observer, StepReport};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

/// How progress is shown.
enum Display {
    Bar(ProgressBar),
    /// A line on stderr every `every` steps (and the last).
    Lines {
        every: u64,
    },
    Hidden,
}

pub struct Progress<'a> {
    display: Display,
    tensorboard: Option<(PathBuf, Option<EventWriter>)>,
    interrupt: &'a interrupt::Guard,
    started: Instant,
    first_step: u64,
    /// Problems writing TensorBoard files: reported once, never fatal to the run.
    tb_error: Option<String>,
}

impl<'a> Progress<'a> {
    /// A bar when stderr is a terminal and the output is not JSON; lines every `every`
    /// steps when stderr is not a terminal; TensorBoard files under `tensorboard`.
    pub fn new(json: bool, every: u64, tensorboard: Option<PathBuf>, interrupt: &'a interrupt::Guard) -> Self {
        let display = if !std::io::stderr().is_terminal() {
            Display::Lines { every: every.max(1) }
        } else if json {
            Display::Hidden
        } else {
            let pb = ProgressBar::new(0);
            pb.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} steps  {msg}  eta {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            Display::Bar(pb)
        };
        Progress {
            display,
            tensorboard: tensorboard.map(|d| (d, None)),
            interrupt,
            started: Instant::now(),
            first_step: 0,
            tb_error: None,
        }
    }

    /// Clears the bar; returns a TensorBoard problem to report, if there was one.
    pub fn finish(&mut self) -> Option<String> {
        if let Display::Bar(pb) = &self.display {
            pb.finish_and_clear();
        }
        self.tb_error.take()
    }

    /// The TensorBoard directory, when files are written.
    pub fn tensorboard_dir(&self) -> Option<&PathBuf> {
        self.tensorboard.as_ref().map(|(d, _)| d)
    }

    fn say(&self, line: &str) {
        match &self.display {
            Display::Bar(pb) => pb.println(line),
            Display::Lines { .. } => eprintln!("{line}"),
            Display::Hidden => {}
        }
    }

    fn scalars(&mut self, step: u64, values: &[(&str, Option<f64>)]) {
        let Some((dir, writer)) = &mut self.tensorboard else { return };
        if writer.is_none() && self.tb_error.is_none() {
            match EventWriter::create(dir) {
                Ok(w) => *writer = Some(w),
                Err(e) => self.tb_error = Some(format!("TensorBoard files in {}: {e}", dir.display())),
            }
        }
        let Some(w) = writer else { return };
        for (tag, value) in values {
            if let Some(v) = value
                && let Err(e) = w.scalar(tag, step, *v)
            {
                self.tb_error = Some(format!("TensorBoard file {}: {e}", w.path().display()));
                self.tensorboard = None;
                return;
            }
        }
    }
}

/// `1h02m`, `3m05s`, `42s`.
pub fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

impl Observer for Progress<'_> {
    fn started(&mut self, first_step: u64, total_steps: u64) {
        (self.first_step, self.started) = (first_step, Instant::now());
        match &self.display {
            Display::Bar(pb) => {
                pb.set_length(total_steps);
                pb.set_position(first_step);
            }
            Display::Lines { .. } if first_step > 0 => {
                self.say(&format!("resuming at step {first_step}/{total_steps}"))
            }
            _ => {}
        }
    }

    fn step(&mut self, r: &StepReport) {
        match &self.display {
            Display::Bar(pb) => {
                pb.set_position(r.step);
                pb.set_message(format!("loss {:.4}  lr {:.2e}  {:.0} tok/s", r.loss, r.lr, r.tokens_per_s));
            }
            Display::Lines { every } if r.step.is_multiple_of(*every) || r.step == r.total_steps => {
                let done = (r.step - self.first_step).max(1) as f64;
                let eta = self.started.elapsed().as_secs_f64() / done * (r.total_steps - r.step) as f64;
                self.say(&format!(
                    "step {}/{}  loss {:.4}  lr {:.2e}  {:.0} tok/s  eta {}",
                    r.step,
                    r.total_steps,
                    r.loss,
                    r.lr,
                    r.tokens_per_s,
                    duration(eta)
                ));
            }
            _ => {}
        }
        let values = [
            ("train/loss", Some(r.loss)),
            ("train/lr", Some(r.lr)),
            ("train/grad_norm", Some(r.grad_norm)),
            ("train/tokens_per_s", Some(r.tokens_per_s)),
        ];
        self.scalars(r.step, &values);
    }

    fn note(&mut self, message: &str) {
        self.say(message);
    }

    fn evaluated(&mut self, r: &EvalReport) {
        let values = [("eval/loss", r.loss), ("eval/perplexity", r.perplexity), ("eval/exact_match", r.exact_match)];
        self.scalars(r.step, &values);
    }

    fn cancelled(&mut self) -> bool {
        self.interrupt.received().is_some()
    }
}

impl Hooks for Progress<'_> {
    fn probing(&mut self, budget_seconds: u32, path: &std::path::Path) {
        self.say(&format!(
            "no plan given: measuring one first (within autotune.budget_seconds, {budget_seconds} s); it is kept as {}",
            path.display()
        ));
    }

    fn planned(&mut self, plan: &UsedPlan) {
        let c = &plan.plan.choices;
        let how = match &plan.source {
            PlanSource::Given(p) => format!("plan {}", p.display()),
            PlanSource::Probed => format!(
                "plan measured now ({} candidates in {} ms)",
                plan.plan.measurements.len(),
                plan.plan.elapsed_ms
            ),
            PlanSource::Kept => format!("the run's plan {}", plan.path.display()),
        };
        self.say(&format!(
            "{how}: threads {} micro-batch {} checkpointing {} gemm rows {}",
            c.threads, c.micro_batch, c.activation_checkpointing, c.gemm_rows
        ));
        for line in plan.plan.note.iter().chain(&plan.plan.warnings) {
            self.say(&format!("  {line}"));
        }
    }

    fn sealing(&mut self) {
        if let Display::Bar(pb) = &self.display {
            pb.set_message("sealing the manifest");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(super::duration(0.4), "0s");
        assert_eq!(super::duration(42.0), "42s");
        assert_eq!(super::duration(185.0), "3m05s");
        assert_eq!(super::duration(3720.0), "1h02m");
    }
}
