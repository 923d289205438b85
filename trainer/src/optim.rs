//! AdamW, gradient clipping and learning-rate schedules.
