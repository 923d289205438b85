//! `train.env` in the training process's environment.
//!
//! The variables a recipe sets are read by libraries when they load (the CUDA and ROCm
//! runtimes, NCCL/RCCL, OpenMP), so they must be in the process's environment before any of
//! that happens, not set later from a running, threaded process (where `setenv` races every
//! `getenv`). The command line re-executes itself with them first thing ([`reexec_with`]); a
//! launcher hands them to its rank processes; and the driver refuses a run whose process lacks
//! them ([`missing`]), rather than train as if they were set (a run launched over the API in a
//! server started without them, say).

use std::collections::BTreeMap;
use std::ffi::OsStr;

/// Set in the environment of a process re-executed by [`reexec_with`], so it never loops.
pub const REEXEC_MARK: &str = "MINDXTRAIN_TRAIN_ENV_APPLIED";

/// The `(name, value)` pairs of `env` that this process's environment does not hold as given.
pub fn missing(env: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
    env.iter()
        .filter(|(k, v)| std::env::var_os(k.as_str()).as_deref() != Some(OsStr::new(v.as_str())))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// Why a run cannot start with `env` in this process, naming the first variable it lacks.
pub fn refusal(env: &BTreeMap<String, String>) -> Option<String> {
    let lacking = missing(env);
    let (k, v) = lacking.first()?;
    Some(format!(
        "train.env.{k}: this process was not started with {k}={v}{more}: the recipe's train.env must be in the \
         training process's environment before it starts (libraries read it when they load); `mindxtrain train` \
         sets it, a server running runs over the API needs it set when it starts",
        more = if lacking.len() > 1 { format!(" (and {} more)", lacking.len() - 1) } else { String::new() }
    ))
}

/// Replaces this process with itself, same arguments, `env` added to its environment, when it
/// lacks any of it; returns only when nothing was needed (`Ok`) or the exec failed.
pub fn reexec_with(env: &BTreeMap<String, String>) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    if missing(env).is_empty() {
        return Ok(());
    }
    if std::env::var_os(REEXEC_MARK).is_some() {
        return Err(std::io::Error::other(refusal(env).unwrap_or_default()));
    }
    let exe = std::env::current_exe()?;
    Err(std::process::Command::new(exe).args(std::env::args_os().skip(1)).envs(env).env(REEXEC_MARK, "1").exec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_the_process_lacks_are_named() {
        let path = std::env::var("PATH").unwrap_or_default();
        let have = BTreeMap::from([("PATH".to_string(), path)]);
        assert!(missing(&have).is_empty());
        assert!(refusal(&have).is_none());
        let lack = BTreeMap::from([("MINDXTRAIN_SURELY_UNSET_VAR".to_string(), "1".to_string())]);
        assert_eq!(missing(&lack), vec![("MINDXTRAIN_SURELY_UNSET_VAR", "1")]);
        let why = refusal(&lack).unwrap();
        assert!(why.starts_with("train.env.MINDXTRAIN_SURELY_UNSET_VAR: "), "{why}");
    }
}
