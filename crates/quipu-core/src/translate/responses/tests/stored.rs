//! Stored conversations: the items' stored shape, and listing them page by page.

use super::*;
use crate::translate::responses::stored::{
    deleted, list_input_items, push_new_items, push_text_input, ListQuery,
};
use serde_json::value::RawValue;

/// `items` (a JSON array) in their stored shape, as the items of the response `resp_abc`.
fn normalize_items(items: &[u8], base: &str) -> serde_json::Result<String> {
    let mut out = String::from("[");
    push_new_items(std::str::from_utf8(items).unwrap(), base, &mut out)?;
    out.push(']');
    Ok(out)
}

#[test]
fn new_items_get_ids_types_statuses_and_parts() {
    let items = br#"[{"role":"user","content":"b"},
        {"type":"message","role":"assistant","content":"c"},
        {"type":"function_call","call_id":"call_1","name":"f","arguments":"{}"},
        {"type":"function_call_output","call_id":"call_1","output":"ok","id":"fco_client"},
        {"type":"reasoning","summary":[],"encrypted_content":"x"}]"#;
    let out = normalize_items(items, "abc").unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let v = json!([null, v[0], v[1], v[2], v[3], v[4]]);
    assert_eq!(
        v[1],
        json!({"id": "msg_abc_in0", "type": "message", "role": "user", "status": "completed",
               "content": [{"type": "input_text", "text": "b"}]})
    );
    assert_eq!(
        v[2]["content"],
        json!([{"type": "output_text", "text": "c", "annotations": []}])
    );
    assert_eq!(v[3]["id"], "fc_abc_in2");
    assert_eq!(v[3]["status"], "completed");
    assert_eq!(v[4]["id"], "fco_client", "a client's id is kept");
    assert_eq!(v[5]["id"], "rs_abc_in4");
    assert_eq!(v[5]["encrypted_content"], "x");
    // What is stored reads back as input.
    let raw: &RawValue = serde_json::from_str(&out).unwrap();
    assert_eq!(
        crate::translate::responses::request::parse_items(raw, "x")
            .unwrap()
            .len(),
        5
    );
}

fn ids(page: &[u8]) -> (Vec<String>, Value) {
    let v: Value = serde_json::from_slice(page).unwrap();
    let ids = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    (ids, v)
}

#[test]
fn input_items_are_listed_newest_first_by_default_and_paged() {
    let items = r#"[{"id":"a"},{"id":"b"},{"id":"c"},{"id":"d"},{"id":"e"}]"#;
    let list = |q: &str| ids(&list_input_items(items, &ListQuery::parse(q).unwrap()).unwrap());
    let (got, v) = list("");
    assert_eq!(got, ["e", "d", "c", "b", "a"]);
    assert_eq!(v["object"], "list");
    assert_eq!(
        (
            v["first_id"].clone(),
            v["last_id"].clone(),
            v["has_more"].clone()
        ),
        (json!("e"), json!("a"), json!(false))
    );
    let (got, v) = list("order=asc&limit=2");
    assert_eq!(got, ["a", "b"]);
    assert_eq!(v["has_more"], true);
    assert_eq!(list("order=asc&limit=2&after=b").0, ["c", "d"]);
    assert_eq!(list("after=c").0, ["b", "a"]);
    assert_eq!(list("order=asc&before=c").0, ["a", "b"]);
    assert_eq!(list("after=zzz").0, Vec::<String>::new());
    let (_, v) = list("after=a");
    assert_eq!(
        (v["first_id"].clone(), v["has_more"].clone()),
        (Value::Null, json!(false))
    );
    assert_eq!(
        list("include%5B%5D=message.input_image.image_url&limit=1").0,
        ["e"]
    );
    for bad in ["limit=0", "limit=101", "limit=x", "order=up", "after=%zz"] {
        assert!(ListQuery::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_deletion_answer() {
    let v: Value = serde_json::from_slice(&deleted("resp_1")).unwrap();
    assert_eq!(
        v,
        json!({"id": "resp_1", "object": "response", "deleted": true})
    );
}

#[test]
fn new_items_are_normalized_from_their_raw_fields() {
    // An escaped key, spaces, a non-string id, a non-object item: read as JSON reads them.
    let items = br#"[ { "ro\u006ce" : "assistant" , "content" : "x \"y\"", "id": null },
        {"type":"function_call","id":"","arguments":"{ }","extra":{"k": [1, 2]}}, 7 ]"#;
    let out = normalize_items(items, "abc").unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        json!([
            {"id": "msg_abc_in0", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "x \"y\"", "annotations": []}]},
            {"id": "fc_abc_in1", "type": "function_call", "status": "completed",
             "arguments": "{ }", "extra": {"k": [1, 2]}},
            7
        ])
    );
    assert!(normalize_items(b"[{\"a\":}]", "abc").is_err());
}

#[test]
fn a_string_input_is_stored_as_its_one_message_would_be() {
    for text in [
        r#""hola, ¿qué tal?""#,
        r#""a \"quoted\" \u00e9 line\n""#,
        r#""""#,
    ] {
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        let mut direct = String::from("[");
        push_text_input(raw, "abc", &mut direct);
        direct.push(']');
        let as_item = format!(r#"[{{"type":"message","role":"user","content":{text}}}]"#);
        assert_eq!(
            direct,
            normalize_items(as_item.as_bytes(), "abc").unwrap(),
            "{text}"
        );
    }
}

#[test]
fn new_items_follow_earlier_ones_with_a_comma() {
    let mut out = String::from(r#"[{"id":"old"}"#);
    push_new_items(r#"[{"id":"n1"}, 3]"#, "abc", &mut out).unwrap();
    let raw: &RawValue = serde_json::from_str(r#""x""#).unwrap();
    push_text_input(raw, "abd", &mut out);
    out.push(']');
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["id"], "old");
    assert_eq!(v[1]["id"], "n1");
    assert_eq!(v[2], 3);
    assert_eq!(v[3]["id"], "msg_abd_in0");
}
