//! The account web page (`GET /account`): a small static page — HTML, CSS and JavaScript
//! compiled into the binary — that signs a person in with one of their tenant's API keys and
//! shows what the account routes answer: balance, spend per day, tokens per model, recent
//! requests, keys and top-ups; with a key that may manage keys, it creates, limits, rotates and
//! revokes them (`/v1/keys`). In Spanish (es-PE) or English, by the browser's language or a
//! switch; times in the tenant's time zone; amounts under S/ 0.01 with their non-zero digits.
//!
//! Nothing is loaded from anywhere but this gateway (no CDN, no font, no analytics): the page
//! is served with a `Content-Security-Policy` of `default-src 'self'` and no inline script or
//! style (see `proxy::respond::asset`), and its chart is drawn by its own script as SVG. The
//! key is kept in the tab's `sessionStorage` only (gone when the tab closes) and sent only as
//! `Authorization: Bearer` to this origin's `/v1/…` routes. Amounts read `S/ 12.34`, the exact
//! figure in their `title` (on hover); the layout fits a phone.
//!
//! This module owns the files and their types; the route is `Route::AccountPage`, answered by
//! `proxy::local`.

/// A file of the page.
#[derive(Debug)]
pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

/// Every file, by the path it is served at (`/account` and `/account/` are the page).
pub static ASSETS: &[Asset] = &[
    Asset {
        path: "/account",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("page/index.html"),
    },
    Asset {
        path: "/account/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("page/app.js"),
    },
    Asset {
        path: "/account/i18n.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("page/i18n.js"),
    },
    Asset {
        path: "/account/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("page/app.css"),
    },
    Asset {
        path: "/account/icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("page/icon.svg"),
    },
];

/// The file served at `path` (a query string or a trailing `/` ignored).
pub fn asset(path: &str) -> Option<&'static Asset> {
    let path = path.split('?').next().unwrap_or(path);
    let path = match path.strip_suffix('/') {
        Some(p) if !p.is_empty() => p,
        _ => path,
    };
    ASSETS.iter().find(|a| a.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(asset("/account").unwrap().path, "/account");
        assert_eq!(asset("/account/").unwrap().path, "/account");
        assert_eq!(
            asset("/account/app.js?v=2").unwrap().content_type,
            "text/javascript; charset=utf-8"
        );
        assert!(asset("/account/nope.js").is_none());
        assert!(asset("/account/../etc/passwd").is_none());
    }

    /// The page loads nothing from elsewhere and runs no inline script or style: what its
    /// `Content-Security-Policy` would refuse in a browser is refused here first.
    #[test]
    fn nothing_external_and_nothing_inline() {
        for a in ASSETS {
            let text = String::from_utf8_lossy(a.body);
            for bad in [
                "http://",
                "https://",
                "//cdn",
                "@import",
                "eval(",
                "innerHTML",
                "document.write",
            ] {
                // The SVG namespace is a name, not a fetch.
                let text = text.replace("http://www.w3.org/2000/svg", "");
                assert!(!text.contains(bad), "{} contains {bad}", a.path);
            }
        }
        let html = String::from_utf8_lossy(asset("/account").unwrap().body);
        assert!(!html.contains("<script>"), "no inline script");
        assert!(!html.contains("style="), "no inline style");
        assert!(!html.contains("<style"), "no inline style");
        // No inline event handler attribute (` onclick=`, ` onload=`, …).
        for (i, _) in html.match_indices(" on") {
            let name: String = html[i + 3..]
                .chars()
                .take_while(char::is_ascii_alphabetic)
                .collect();
            let after = html[i + 3 + name.len()..].chars().next();
            assert!(
                name.is_empty() || after != Some('='),
                "inline handler on{name}="
            );
        }
        for used in [
            "/account/app.js",
            "/account/i18n.js",
            "/account/app.css",
            "/account/icon.svg",
        ] {
            assert!(html.contains(used), "{used}");
        }
    }
}
