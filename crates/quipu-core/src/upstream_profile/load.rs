//! How each server reports its own load: the gauges of requests running and waiting in its
//! own scheduler, read from its Prometheus endpoint (`GET /metrics` at the server's root, not
//! under `/v1`), for capacity-aware dispatch (see [`crate::schedule`]).
//!
//! | server | running | waiting | notes |
//! |---|---|---|---|
//! | vLLM | `vllm:num_requests_running` | `vllm:num_requests_waiting` | one sample per engine (`engine`, `model_name` labels): summed |
//! | SGLang | `sglang:num_running_reqs` | `sglang:num_queue_reqs` | `--enable-metrics` |
//! | llama.cpp | `llamacpp:requests_processing` | `llamacpp:requests_deferred` | `llama-server --metrics` |
//!
//! Only these two gauges are read, line by line: a sample line is `name{labels} value` (or
//! `name value`), comments start with `#`. That is the whole of what is needed of the
//! exposition format, so it is read here rather than through a parser crate (none of the
//! dependencies has one; a crate for two gauges would add more than it saves).

use super::Server;
use crate::schedule::EngineLoad;

/// Where a server's load is read, relative to its root (the replica URL without `/v1`).
pub const LOAD_PATH: &str = "/metrics";

/// The names of a server's running and waiting gauges.
pub fn gauges(server: Server) -> (&'static str, &'static str) {
    match server {
        Server::Vllm => (super::vllm::RUNNING_GAUGE, super::vllm::WAITING_GAUGE),
        Server::Sglang => (super::sglang::RUNNING_GAUGE, super::sglang::WAITING_GAUGE),
        Server::LlamaCpp => (
            super::llamacpp::RUNNING_GAUGE,
            super::llamacpp::WAITING_GAUGE,
        ),
    }
}

/// The load a `/metrics` body reports, or `None` if it has neither gauge (the server does not
/// export them: metrics off, or another server).
pub fn parse_load(server: Server, body: &str) -> Option<EngineLoad> {
    let (running_name, waiting_name) = gauges(server);
    let (mut running, mut waiting) = (None::<f64>, None::<f64>);
    for line in body.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => (&line[..i], &line[i..]),
            None => continue,
        };
        let slot = if name == running_name {
            &mut running
        } else if name == waiting_name {
            &mut waiting
        } else {
            continue;
        };
        // The value follows the labels (which may hold spaces inside quotes).
        let after_labels = match rest.strip_prefix('{') {
            Some(labels) => match labels.rfind('}') {
                Some(end) => &labels[end + 1..],
                None => continue,
            },
            None => rest,
        };
        let value = after_labels.split_whitespace().next();
        if let Some(v) = value.and_then(|v| v.parse::<f64>().ok()) {
            if v.is_finite() && v >= 0.0 {
                *slot = Some(slot.unwrap_or(0.0) + v);
            }
        }
    }
    if running.is_none() && waiting.is_none() {
        return None;
    }
    let count = |v: Option<f64>| v.map_or(0, |v| v.round().min(f64::from(u32::MAX)) as u32);
    Some(EngineLoad {
        running: count(running),
        waiting: count(waiting),
        slots: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_gauges_are_summed_over_engines() {
        let body =
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3 32B\"} 6.0\n\
vllm:num_requests_running{engine=\"1\",model_name=\"Qwen/Qwen3 32B\"} 2.0\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"Qwen/Qwen3 32B\"} 3.0\n\
vllm:num_requests_waiting_by_reason{reason=\"capacity\"} 9.0\n\
vllm:generation_tokens_total 1234.0\n";
        assert_eq!(
            parse_load(Server::Vllm, body),
            Some(EngineLoad {
                running: 8,
                waiting: 3,
                slots: None
            })
        );
    }

    #[test]
    fn llama_cpp_and_sglang_names() {
        let l = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n";
        assert_eq!(
            parse_load(Server::LlamaCpp, l).map(|x| (x.running, x.waiting)),
            Some((2, 1))
        );
        let s = "sglang:num_running_reqs{model_name=\"m\"} 5.0\nsglang:num_queue_reqs{model_name=\"m\"} 0.0\n";
        assert_eq!(
            parse_load(Server::Sglang, s).map(|x| (x.running, x.waiting)),
            Some((5, 0))
        );
    }

    #[test]
    fn no_gauge_no_report_and_garbage_is_skipped() {
        assert_eq!(parse_load(Server::Vllm, "up 1\n# nothing\n"), None);
        assert_eq!(
            parse_load(Server::Sglang, "vllm:num_requests_running 3\n"),
            None
        );
        let bad = "vllm:num_requests_running{model_name=\"x\"} NaN\nvllm:num_requests_running{oops 4\nvllm:num_requests_waiting -1\n";
        assert_eq!(
            parse_load(Server::Vllm, bad).map(|x| (x.running, x.waiting)),
            None,
            "no sample that parses"
        );
    }
}
