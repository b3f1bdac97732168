//! The public read endpoints, answered by the gateway itself: `GET /v1/models`,
//! `GET /v1/models/{id}`, `GET /v1/pricing`, `GET /v1/plans`.
//!
//! Bodies are rendered once from the validated config at start and served as shared bytes.
//! `/v1/models` carries Quipu's own catalog, `{"models":[{slug, displayName, description, vision,
//! inPlans, inFree}]}`, and, in the same object, the list shape the vendor SDKs read (`object`,
//! `data`, `has_more`, `first_id`, `last_id`), so `client.models.list()` works in both official
//! SDKs. Prices are JSON numbers written from the
//! exact decimals of the config (never through a float).

use crate::config::Config;
use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::HashMap;

/// When the catalog says the models were created (the SDKs require a timestamp).
const CREATED_UNIX: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z
const CREATED_RFC3339: &str = "2026-01-01T00:00:00Z";

/// Pre-rendered catalog bodies.
#[derive(Debug, Clone)]
pub struct Catalog {
    pub models: Bytes,
    pub pricing: Bytes,
    pub plans: Bytes,
    by_id: HashMap<String, Bytes>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpecModel<'a> {
    slug: &'a str,
    display_name: &'a str,
    description: &'a str,
    vision: bool,
    in_plans: bool,
    in_free: bool,
}

#[derive(Serialize)]
struct SdkModel<'a> {
    id: &'a str,
    object: &'static str,
    #[serde(rename = "type")]
    kind: &'static str,
    display_name: &'a str,
    created: i64,
    created_at: &'static str,
    owned_by: &'static str,
}

#[derive(Serialize)]
struct ModelsBody<'a> {
    models: Vec<SpecModel<'a>>,
    object: &'static str,
    data: &'a [SdkModel<'a>],
    has_more: bool,
    first_id: Option<&'a str>,
    last_id: Option<&'a str>,
}

/// An object of named entries in the order given: a model's rates (`Prices::published`), or
/// the models' rates in the config's order.
struct Ordered<'a, V>(Vec<(&'a str, V)>);

impl<V: Serialize> Serialize for Ordered<'_, V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

type Rates = Ordered<'static, Box<RawValue>>;
type RatesBySlug<'a> = Ordered<'a, Rates>;

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PricingBody<'a> {
    currency: &'static str,
    per_million_tokens: RatesBySlug<'a>,
    #[serde(rename = "minTopUpPEN")]
    min_top_up: &'a RawValue,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PlanBody<'a> {
    id: &'a str,
    display_name: &'a str,
    #[serde(rename = "pricePEN")]
    price: Box<RawValue>,
    usage_label: &'a str,
    web_search: bool,
}

#[derive(Serialize)]
struct PlansBody<'a> {
    plans: Vec<PlanBody<'a>>,
}

/// A JSON number from an exact decimal string (`"0.5"`), without a float in between.
fn number(text: String) -> Result<Box<RawValue>, serde_json::Error> {
    RawValue::from_string(text)
}

impl Catalog {
    pub fn new(config: &Config) -> Result<Catalog, serde_json::Error> {
        let sdk: Vec<SdkModel> = config
            .models
            .iter()
            .map(|m| SdkModel {
                id: &m.slug,
                object: "model",
                kind: "model",
                display_name: &m.display_name,
                created: CREATED_UNIX,
                created_at: CREATED_RFC3339,
                owned_by: "quipu",
            })
            .collect();
        let models = ModelsBody {
            models: config
                .models
                .iter()
                .map(|m| SpecModel {
                    slug: &m.slug,
                    display_name: &m.display_name,
                    description: &m.description,
                    vision: m.vision,
                    in_plans: m.in_plans,
                    in_free: m.in_free,
                })
                .collect(),
            object: "list",
            data: &sdk,
            has_more: false,
            first_id: sdk.first().map(|m| m.id),
            last_id: sdk.last().map(|m| m.id),
        };
        let mut by_id = HashMap::new();
        for m in &sdk {
            by_id.insert(m.id.to_owned(), Bytes::from(serde_json::to_vec(m)?));
        }

        let mut per_million = Vec::with_capacity(config.models.len());
        for m in &config.models {
            let mut rates = Vec::new();
            for (name, rate) in m.prices.published() {
                rates.push((name, number(rate.per_million().to_json_number())?));
            }
            per_million.push((m.slug.as_str(), Ordered(rates)));
        }
        let min_top_up = number(config.billing.min_top_up.to_json_number())?;
        let pricing = PricingBody {
            currency: "PEN",
            per_million_tokens: Ordered(per_million),
            min_top_up: &min_top_up,
        };
        let plans = PlansBody {
            plans: config
                .plans
                .iter()
                .map(|p| {
                    Ok(PlanBody {
                        id: &p.id,
                        display_name: &p.display_name,
                        price: number(p.price.to_json_number())?,
                        usage_label: &p.usage_label,
                        web_search: p.web_search,
                    })
                })
                .collect::<Result<_, serde_json::Error>>()?,
        };
        Ok(Catalog {
            models: Bytes::from(serde_json::to_vec(&models)?),
            pricing: Bytes::from(serde_json::to_vec(&pricing)?),
            plans: Bytes::from(serde_json::to_vec(&plans)?),
            by_id,
        })
    }

    /// `GET /v1/models/{id}` in the SDK shape.
    pub fn model(&self, id: &str) -> Option<Bytes> {
        self.by_id.get(id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EMBEDDED_DEFAULT;
    use serde_json::Value;

    fn catalog() -> Catalog {
        Catalog::new(&Config::parse(EMBEDDED_DEFAULT, "t").unwrap()).unwrap()
    }

    #[test]
    fn models_in_spec_and_sdk_shapes() {
        let v: Value = serde_json::from_slice(&catalog().models).unwrap();
        let m = &v["models"][0];
        assert_eq!(m["slug"], "colibri");
        for k in ["displayName", "description", "vision", "inPlans", "inFree"] {
            assert!(m.get(k).is_some(), "{k}");
        }
        assert_eq!(v["models"].as_array().unwrap().len(), 3);
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][1]["id"], "aguila");
        assert_eq!(v["data"][1]["type"], "model");
        assert_eq!(v["data"][1]["display_name"], "Águila");
        assert_eq!(v["has_more"], false);
        assert_eq!(v["first_id"], "colibri");
        assert_eq!(v["last_id"], "apu");
    }

    #[test]
    fn pricing_numbers_are_exact_decimals() {
        let raw = String::from_utf8(catalog().pricing.to_vec()).unwrap();
        assert!(raw.contains(r#""inputPerMillionPEN":0.2"#), "{raw}");
        let order: Vec<usize> = ["colibri", "aguila", "apu"]
            .iter()
            .map(|s| raw.find(&format!("\"{s}\":{{")).unwrap())
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "config order: {raw}");
        let v: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(v["currency"], "PEN");
        assert_eq!(v["perMillionTokens"]["apu"]["outputPerMillionPEN"], 12);
        assert_eq!(v["perMillionTokens"]["colibri"]["cachePerMillionPEN"], 0.05);
        assert_eq!(v["minTopUpPEN"], 10);
    }

    #[test]
    fn pricing_publishes_every_rate_of_every_model() {
        let v: Value = serde_json::from_slice(&catalog().pricing).unwrap();
        let config = Config::parse(EMBEDDED_DEFAULT, "t").unwrap();
        for m in &config.models {
            let shown = v["perMillionTokens"][m.slug.as_str()].as_object().unwrap();
            let published = m.prices.published();
            assert_eq!(shown.len(), published.len(), "{}: {shown:?}", m.slug);
            for (name, rate) in published {
                let exact = rate.per_million().to_json_number();
                assert_eq!(shown[name].to_string(), exact, "{} {name}", m.slug);
            }
        }
    }

    #[test]
    fn plans_shape() {
        let v: Value = serde_json::from_slice(&catalog().plans).unwrap();
        let p = &v["plans"][1];
        assert_eq!(p["id"], "basico");
        assert_eq!(p["pricePEN"], 19.9);
        assert_eq!(p["webSearch"], true);
        assert!(p["usageLabel"].is_string());
        assert!(p["displayName"].is_string());
    }

    #[test]
    fn single_model() {
        let c = catalog();
        let v: Value = serde_json::from_slice(&c.model("apu").unwrap()).unwrap();
        assert_eq!(v["id"], "apu");
        assert!(c.model("gpt-4").is_none());
    }
}
