//! What the simulated model "generates" for a request: deterministic, from the prompt.

use crate::directives::Directives;
use crate::tokenizer;

const WORDS: &[&str] = &[
    "el",
    "modelo",
    "responde",
    "con",
    "calma",
    "y",
    "precisión",
    "sobre",
    "la",
    "pregunta",
    "del",
    "usuario",
    "Lima",
    "Cusco",
    "quipu",
    "cuenta",
    "cada",
    "token",
    "hoy",
    "mañana",
    "the",
    "answer",
    "is",
    "clear",
    "because",
    "data",
    "flows",
    "one",
    "way",
    "through",
    "gateway",
    "stream",
    "chunk",
    "río",
    "montaña",
    "sol",
    "luna",
    "cóndor",
    "llama",
    "café",
];
/// Used in `split` mode so that frame splits land inside multi-byte characters.
const WIDE_WORDS: &[&str] = &["ñandú", "café", "🦙", "acción", "niño", "€uro", "日本"];

/// One delta of the generated message.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Reasoning(String),
    Content(String),
    /// A tool call starts: (call index, id, name).
    ToolStart(usize, String, String),
    /// A fragment of a tool call's arguments.
    ToolArgs(usize, String),
}

#[derive(Debug, Clone)]
pub struct Plan {
    pub pieces: Vec<Piece>,
    pub finish_reason: &'static str,
    pub stop_reason: Option<String>,
    pub completion_tokens: usize,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn words(rng: &mut Rng, n: usize, wide: bool) -> Vec<String> {
    (0..n)
        .map(|i| {
            let list = if wide && i % 2 == 1 {
                WIDE_WORDS
            } else {
                WORDS
            };
            let w = list[(rng.next() % list.len() as u64) as usize];
            if i == 0 {
                w.to_owned()
            } else {
                format!(" {w}")
            }
        })
        .collect()
}

pub fn plan(seed: u64, d: &Directives, max_tokens: usize, named_tool_choice: bool) -> Plan {
    let mut rng = Rng(seed | 1);
    let mut pieces = Vec::new();
    let mut used = 0usize;
    let mut finish = "stop";
    for w in words(&mut rng, d.reasoning, false) {
        if used >= max_tokens {
            finish = "length";
            break;
        }
        pieces.push(Piece::Reasoning(w));
        used += 1;
    }
    let content: Vec<String> = match &d.reply {
        Some(text) => tokenizer::pieces(text)
            .into_iter()
            .map(str::to_owned)
            .collect(),
        None => {
            let n = d.tokens.unwrap_or(if d.tool.is_some() { 5 } else { 20 });
            let mut w = words(&mut rng, n, d.split);
            if d.word_bytes > 0 {
                for word in &mut w {
                    while word.len() < d.word_bytes {
                        word.push('x');
                    }
                }
            }
            w
        }
    };
    for w in content {
        if used >= max_tokens {
            finish = "length";
            break;
        }
        pieces.push(Piece::Content(w));
        used += 1;
    }
    if finish != "length" {
        if let Some(name) = &d.tool {
            let args = d
                .tool_args
                .clone()
                .unwrap_or_else(|| r#"{"city":"Lima","days":3}"#.to_owned());
            for k in 0..d.tools {
                let id = format!("chatcmpl-tool-{:016x}", rng.next());
                pieces.push(Piece::ToolStart(k, id, name.clone()));
                used += 1;
                if d.args_lump {
                    pieces.push(Piece::ToolArgs(k, args.clone()));
                    used += 1;
                } else {
                    let chars: Vec<char> = args.chars().collect();
                    for frag in chars.chunks(7) {
                        pieces.push(Piece::ToolArgs(k, frag.iter().collect()));
                        used += 1;
                    }
                }
            }
            finish = if named_tool_choice {
                "stop"
            } else {
                "tool_calls"
            };
        }
    }
    let mut stop_reason = None;
    if let Some(s) = &d.stop {
        if finish == "stop" {
            stop_reason = Some(s.clone());
        }
    }
    if d.abort {
        finish = "abort";
    }
    Plan {
        pieces,
        finish_reason: finish,
        stop_reason,
        completion_tokens: used,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_bounded() {
        let d = Directives::default();
        let a = plan(42, &d, 100, false);
        let b = plan(42, &d, 100, false);
        assert_eq!(a.pieces, b.pieces);
        assert_eq!(a.completion_tokens, 20);
        let c = plan(42, &d, 5, false);
        assert_eq!(c.finish_reason, "length");
        assert_eq!(c.completion_tokens, 5);
    }

    #[test]
    fn tool_calls() {
        let d = Directives {
            tool: Some("get_weather".into()),
            tools: 2,
            ..Directives::default()
        };
        let p = plan(1, &d, 1000, false);
        assert_eq!(p.finish_reason, "tool_calls");
        let args: String = p
            .pieces
            .iter()
            .filter_map(|x| match x {
                Piece::ToolArgs(0, a) => Some(a.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(args, r#"{"city":"Lima","days":3}"#);
        assert_eq!(plan(1, &d, 1000, true).finish_reason, "stop");
    }
}
