//! Validation: defaults, every problem reported with its key, bounds, secrets, switches.

use super::*;

#[test]
fn minimal_gets_defaults() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.server.max_body_bytes, 32 * 1024 * 1024);
    let m = &c.models[0];
    assert_eq!(m.replicas[0].api_base, "/v1");
    assert_eq!(m.replicas[0].chat_path(), "/v1/chat/completions");
    assert_eq!(m.prices.output, Rate::parse("0.8").unwrap());
    assert_eq!(c.billing.min_top_up, Pen::from_centimos(1000));
}

#[test]
fn every_problem_is_reported_with_its_key() {
    let text = r#"
[server]
threads = 0
listen = "nowhere"
[store]
url = "mysql://x"
[billing]
min_top_up = "ten"
[[models]]
slug = "Bad Slug"
display_name = ""
upstream_model = "q"
upstreams = ["ftp://x"]
prices = { input = "0.1234567", cached = "-1", output = "1" }
routing = "random"
[aliases]
"gpt-*" = "nope"
"#;
    let e = parse(text).unwrap_err().0;
    let joined = e.join("\n");
    for needle in [
        "server.threads",
        "server.listen",
        "store.url",
        "billing.min_top_up",
        "models[0].slug",
        "models[0].display_name",
        "models[0].upstreams[0]",
        "models[0].prices.input",
        "models[0].prices.cached",
        "models[0].routing",
        "aliases.\"gpt-*\"",
    ] {
        assert!(joined.contains(needle), "missing {needle} in:\n{joined}");
    }
}

#[test]
fn responses_section_defaults_and_bounds() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.responses.retention, Duration::from_secs(30 * 86_400));
    assert_eq!(c.responses.max_bytes_per_tenant, 256 * 1024 * 1024);
    assert_eq!(c.responses.cleanup_interval, Duration::from_secs(300));
    assert_eq!(c.responses.max_queued_bytes, 64 * 1024 * 1024);
    let c = parse(&format!(
        "[responses]\nretention_days = 1\nmax_mib_per_tenant = 2\ncleanup_interval_s = 5\nmax_queued_mib = 1\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(c.responses.retention, Duration::from_secs(86_400));
    assert_eq!(c.responses.max_bytes_per_tenant, 2 * 1024 * 1024);
    let e = parse(&format!(
        "[responses]\nretention_days = 0\nmax_mib_per_tenant = 0\ncleanup_interval_s = 0\nmax_queued_mib = 0\n{MINIMAL}"
    ))
    .unwrap_err()
    .0
    .join("\n");
    for key in [
        "responses.retention_days",
        "responses.max_mib_per_tenant",
        "responses.cleanup_interval_s",
        "responses.max_queued_mib",
    ] {
        assert!(e.contains(key), "{key} missing in {e}");
    }
    assert!(parse(&format!("[responses]\nkeep = true\n{MINIMAL}")).is_err());
}

#[test]
fn shutdown_flush_and_spill_dir() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.store.shutdown_flush_timeout, Duration::from_secs(30));
    assert_eq!(c.store.spill_dir, PathBuf::from("data/ledger-spill"));
    let with_store = |store: &str| parse(&format!("[store]\n{store}\n{MINIMAL}"));
    let c = with_store("url = \"sqlite:///var/lib/quipu/quipu.db\"").unwrap();
    assert_eq!(
        c.store.spill_dir,
        PathBuf::from("/var/lib/quipu/ledger-spill")
    );
    let c = with_store("url = \"sqlite://quipu.db\"").unwrap();
    assert_eq!(c.store.spill_dir, PathBuf::from("ledger-spill"));
    for url in ["postgres://q@db/quipu", "sqlite://:memory:"] {
        let c = with_store(&format!("url = \"{url}\"")).unwrap();
        assert_eq!(
            c.store.spill_dir,
            PathBuf::from("data/ledger-spill"),
            "{url}"
        );
    }
    let c = with_store("spill_dir = \"/srv/spill\"\nshutdown_flush_timeout_s = 5").unwrap();
    assert_eq!(c.store.spill_dir, PathBuf::from("/srv/spill"));
    assert_eq!(c.store.shutdown_flush_timeout, Duration::from_secs(5));
    for bad in ["0", "3601"] {
        let e = with_store(&format!("shutdown_flush_timeout_s = {bad}")).unwrap_err();
        assert!(
            e.to_string()
                .contains("store.shutdown_flush_timeout_s must be between 1 and 3600"),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("got {bad}")), "{e}");
    }
    let e = with_store("spill_dir = \" \"").unwrap_err();
    assert!(
        e.to_string()
            .contains("store.spill_dir must name a directory"),
        "{e}"
    );
}

#[test]
fn head_and_key_poll_limits_are_bounded() {
    for (server, store, needle) in [
        (
            "max_header_bytes = 100",
            "",
            "server.max_header_bytes must be between 1024 and 1048575",
        ),
        ("max_header_bytes = 2000000", "", "server.max_header_bytes"),
        (
            "",
            "key_refresh_ms = 2000",
            "store.key_refresh_ms must be between 1 and 1500",
        ),
    ] {
        let text = format!("{MINIMAL}\n[server]\n{server}\n[store]\n{store}\n");
        let e = parse(&text).unwrap_err();
        assert!(e.to_string().contains(needle), "{e}");
    }
    let c = parse(&format!("{MINIMAL}\n[server]\nmax_header_bytes = 8192\n")).unwrap();
    assert_eq!(c.server.max_header_bytes, 8192);
    assert_eq!(parse(MINIMAL).unwrap().server.max_header_bytes, 64 * 1024);
}

#[test]
fn the_admin_listener_takes_tls_only_with_the_api_listeners_certificate() {
    let e = parse(&format!("{MINIMAL}\n[server]\nadmin_tls = true\n")).unwrap_err();
    assert!(e.to_string().contains("server.admin_tls"), "{e}");
    let c = parse(&format!(
        "{MINIMAL}\n[server]\nadmin_tls = true\ntls = {{ cert = \"c.pem\", key = \"k.pem\" }}\n"
    ))
    .unwrap();
    assert!(c.server.admin_tls && c.server.tls.is_some());
    assert!(!parse(MINIMAL).unwrap().server.admin_tls);
}

#[test]
fn unknown_keys_are_refused() {
    let e = parse(&format!("{MINIMAL}\n[server]\nlisten_port = 1\n")).unwrap_err();
    assert!(e.to_string().contains("listen_port"), "{e}");
}

#[test]
fn secrets_from_environment() {
    let text = format!("{MINIMAL}\n[server]\nadmin_token = \"env:QUIPU_TEST_TOKEN\"\n");
    let raw: RawConfig = toml::from_str(&text).unwrap();
    let e = Config::from_raw(raw, &no_env).unwrap_err();
    assert!(e.0[0].contains("QUIPU_TEST_TOKEN"));
    let raw: RawConfig = toml::from_str(&text).unwrap();
    let c = Config::from_raw(raw, &|n| {
        (n == "QUIPU_TEST_TOKEN").then(|| "0123456789abcdef-token".to_owned())
    })
    .unwrap();
    assert_eq!(
        c.server.admin_token.as_deref(),
        Some("0123456789abcdef-token")
    );
}

#[test]
fn thinking_switch_may_not_override_reserved_fields() {
    let text = format!("{MINIMAL}thinking_on = {{ stream = false }}\n");
    let e = parse(&text).unwrap_err();
    assert!(e.0[0].contains("models[0].thinking_on may not set \"stream\""));
    let text = format!("{MINIMAL}thinking_off = {{ add_generation_prompt = false }}\n");
    let e = parse(&text).unwrap_err();
    assert!(
        e.0[0].contains("may not set \"add_generation_prompt\""),
        "{e}"
    );
}

#[test]
fn absurd_rates_are_refused_at_validation() {
    let text = MINIMAL.replace("output = \"0.80\"", "output = \"80000000\"");
    let e = parse(&text).unwrap_err();
    assert!(e.0[0].starts_with("models[0].prices.output:"), "{e}");
    assert!(e.0[0].contains("S/ 1 per token"), "{e}");
}

#[test]
fn image_url_policies() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.security.image_urls, ImageUrlPolicy::Forward);
    for (v, want) in [
        ("forward", ImageUrlPolicy::Forward),
        ("forward_any", ImageUrlPolicy::ForwardAny),
        ("reject", ImageUrlPolicy::Reject),
    ] {
        let c = parse(&format!("[security]\nimage_urls = \"{v}\"\n{MINIMAL}")).unwrap();
        assert_eq!(c.security.image_urls, want);
    }
    let e = parse(&format!("[security]\nimage_urls = \"any\"\n{MINIMAL}")).unwrap_err();
    assert!(e.0[0].contains("forward_any"), "{e}");
}

#[test]
fn prefill_switch_defaults_on() {
    assert!(parse(MINIMAL).unwrap().models[0].prefill);
    let c = parse(&format!("{MINIMAL}prefill = false\n")).unwrap();
    assert!(!c.models[0].prefill);
    let e = parse(&format!("{MINIMAL}prefill = \"yes\"\n")).unwrap_err();
    assert!(e.to_string().contains("prefill"), "{e}");
}

#[test]
fn the_server_kind_is_auto_unless_named() {
    use crate::upstream_profile::{Server, ServerChoice};
    let m = &parse(MINIMAL).unwrap().models[0];
    assert_eq!(
        (m.server, m.tokenize_path.as_deref()),
        (ServerChoice::Auto, None)
    );
    let c = parse(&format!(
        "{MINIMAL}server = \"llama.cpp\"\ntokenize_path = \"/x/tokenize\"\n"
    ))
    .unwrap();
    let m = &c.models[0];
    assert_eq!(m.server, ServerChoice::Known(Server::LlamaCpp));
    assert_eq!(m.tokenize_path.as_deref(), Some("/x/tokenize"));
    let e = parse(&format!("{MINIMAL}server = \"tgi\"\n")).unwrap_err();
    assert!(e.to_string().contains(".server must be"), "{e}");
    let e = parse(&format!("{MINIMAL}tokenize_path = \"tokenize\"\n")).unwrap_err();
    assert!(
        e.to_string().contains("tokenize_path must start with '/'"),
        "{e}"
    );
}

#[test]
fn url_redaction() {
    assert_eq!(
        redact_url("postgres://quipu:secret@db:5432/quipu"),
        "postgres://quipu:***@db:5432/quipu"
    );
    assert_eq!(redact_url("sqlite://data/q.db"), "sqlite://data/q.db");
}

#[test]
fn pid_file_and_upgrade_sock_follow_the_listener_unless_set() {
    let with_server = |server: &str| parse(&format!("[server]\n{server}\n{MINIMAL}")).unwrap();
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.server.pid_file, "/tmp/quipu-8080.pid");
    assert_eq!(c.server.upgrade_sock, "/tmp/quipu-8080_upgrade.sock");
    // Two replicas on one host, on other ports: files of their own.
    let a = with_server("listen = \"0.0.0.0:8081\"");
    let b = with_server("listen = \"127.0.0.1:8082\"");
    assert_eq!(a.server.pid_file, "/tmp/quipu-8081.pid");
    assert_eq!(b.server.pid_file, "/tmp/quipu-127.0.0.1-8082.pid");
    assert_eq!(
        b.server.upgrade_sock,
        "/tmp/quipu-127.0.0.1-8082_upgrade.sock"
    );
    assert_ne!(a.server.upgrade_sock, b.server.upgrade_sock);
    let v6 = with_server("listen = \"[::1]:8083\"");
    assert_eq!(v6.server.pid_file, "/tmp/quipu-__1-8083.pid");
    // Explicit settings win.
    let set = with_server("pid_file = \"/run/q.pid\"\nupgrade_sock = \"/run/q.sock\"");
    assert_eq!(
        (
            set.server.pid_file.as_str(),
            set.server.upgrade_sock.as_str()
        ),
        ("/run/q.pid", "/run/q.sock")
    );
    let e = parse(&format!("[server]\npid_file = \" \"\n{MINIMAL}"))
        .unwrap_err()
        .0
        .join("\n");
    assert!(
        e.contains("server.pid_file") && e.contains("/tmp/quipu-8080.pid"),
        "{e}"
    );
}

#[test]
fn limit_engine_and_window() {
    let c = parse(MINIMAL).unwrap();
    assert_eq!(c.limits.engine, LimitEngine::Auto);
    assert_eq!(c.limits.window, Duration::from_secs(60));
    let c = parse(&format!(
        "[limits]\nengine = \"store\"\nwindow_s = 5\n{MINIMAL}"
    ))
    .unwrap();
    assert_eq!(
        (c.limits.engine, c.limits.window),
        (LimitEngine::Store, Duration::from_secs(5))
    );
    let local = parse(&format!("[limits]\nengine = \"local\"\n{MINIMAL}")).unwrap();
    assert_eq!(local.limits.engine, LimitEngine::Local);
    let e = parse(&format!(
        "[limits]\nengine = \"redis\"\nwindow_s = 0\n{MINIMAL}"
    ))
    .unwrap_err()
    .0
    .join("\n");
    assert!(
        e.contains("limits.engine") && e.contains("limits.window_s"),
        "{e}"
    );
}

#[test]
fn webhooks_need_an_http_url_a_secret_and_known_events() {
    let c = parse(MINIMAL).unwrap();
    assert!(c.webhooks.is_empty());
    assert_eq!(c.webhook_delivery.backoff.max_attempts, 20);
    let ok = format!(
        "{MINIMAL}\n[[webhooks]]\nurl = \"https://ops.example.com/q\"\nsecret = \"env:HOOK\"\nevents = [\"topup.received\"]\n\
         [[webhooks]]\nurl = \"http://127.0.0.1:9/\"\nsecret = \"s\"\n\
         [webhook_delivery]\nfirst_retry_ms = 200\nmax_attempts = 3\n"
    );
    let env = |n: &str| (n == "HOOK").then(|| "whsec_x".to_owned());
    let c = Config::parse_with_env(&ok, "t", &env).unwrap();
    assert_eq!(c.webhooks.len(), 2);
    assert_eq!(c.webhooks[0].secret, "whsec_x");
    assert!(c.webhooks[0].events.matches("topup.received"));
    assert!(!c.webhooks[0].events.matches("balance.low"));
    assert!(c.webhooks[1].events.matches("balance.low"));
    assert!(c.webhooks[0].id.starts_with("op_") && c.webhooks[0].id != c.webhooks[1].id);
    assert_eq!(c.webhook_delivery.backoff.first, Duration::from_millis(200));
    assert_eq!(c.webhook_delivery.backoff.max_attempts, 3);

    let bad = format!(
        "{MINIMAL}\n[[webhooks]]\nurl = \"ftp://x\"\nsecret = \"\"\nevents = [\"nope\"]\n\
         [[webhooks]]\nurl = \"http://a/\"\nsecret = \"s\"\n[[webhooks]]\nurl = \"http://a/\"\nsecret = \"s\"\n\
         [webhook_delivery]\ntimeout_ms = 0\n"
    );
    let e = parse(&bad).unwrap_err().0.join("\n");
    for needle in [
        "webhooks[0].url",
        "webhooks[0].secret",
        "webhooks[0].events",
        "webhooks[2].url",
        "webhook_delivery.timeout_ms",
    ] {
        assert!(e.contains(needle), "missing {needle} in:\n{e}");
    }
}
