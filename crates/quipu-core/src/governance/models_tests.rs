use super::*;
use crate::config::EMBEDDED_DEFAULT;

/// The shipped catalog, plus an exact alias (`gpt-4o`) and a one-character pattern.
fn catalog() -> Catalog<'static> {
    Catalog::new(
        vec!["colibri", "aguila", "apu"],
        vec![
            ("gpt-4o", "aguila"),
            ("o?", "apu"),
            ("claude-opus-*", "apu"),
            ("claude-sonnet-*", "aguila"),
            ("claude-haiku-*", "colibri"),
        ],
    )
}

fn allowed(list: &str) -> AllowedModels {
    let list = ModelList::parse(list).unwrap();
    list.validate(&catalog()).unwrap();
    list.compile(&catalog())
}

#[test]
fn slugs_allow_themselves_under_any_name() {
    let a = allowed("colibri, aguila");
    assert_eq!(a.slugs(), ["colibri", "aguila"]);
    assert!(a.check("colibri", "colibri").is_ok());
    // The same model through an alias is the same model.
    assert!(a.check("claude-haiku-4-5", "colibri").is_ok());
    assert!(a.check("gpt-4o", "aguila").is_ok());
    let no = a.check("apu", "apu").unwrap_err();
    assert_eq!(no.to_string(), "this key may use colibri, aguila; not apu");
    let no = a.check("claude-opus-4-1", "apu").unwrap_err();
    assert_eq!(
        no,
        ModelNotAllowed {
            requested: "claude-opus-4-1".into(),
            slug: "apu".into(),
            allowed: vec!["colibri".into(), "aguila".into()],
        }
    );
}

#[test]
fn alias_names_and_patterns_stand_for_their_model() {
    // An exact alias, a name an alias pattern matches, and the pattern itself.
    assert_eq!(allowed("gpt-4o").slugs(), ["aguila"]);
    assert_eq!(allowed("claude-opus-4-1").slugs(), ["apu"]);
    assert_eq!(allowed("claude-opus-*").slugs(), ["apu"]);
    // So a key limited by an alias may name the model by its slug too.
    assert!(allowed("claude-opus-*").check("apu", "apu").is_ok());
}

#[test]
fn globs_match_slugs_and_alias_patterns() {
    assert_eq!(allowed("*").slugs(), ["colibri", "aguila", "apu"]);
    // `a*` matches the slugs aguila and apu.
    assert_eq!(allowed("a*").slugs(), ["aguila", "apu"]);
    // `claude-*` matches no slug but all three claude patterns.
    assert_eq!(allowed("claude-*").slugs(), ["colibri", "aguila", "apu"]);
    assert_eq!(allowed("claude-s*").slugs(), ["aguila"]);
    // `?` is one character: `c?libri` is colibri; `??` matches the pattern `o?` (apu),
    // `???` the slug apu.
    assert_eq!(allowed("c?libri").slugs(), ["colibri"]);
    assert_eq!(allowed("??").slugs(), ["apu"]);
    assert_eq!(allowed("???").slugs(), ["apu"]);
    assert_eq!(allowed("o*").slugs(), ["apu"]);
    // Globs and names mix; the set is in catalog order whatever the list's order.
    assert_eq!(allowed("apu, claude-h*").slugs(), ["colibri", "apu"]);
}

#[test]
fn an_entry_that_names_nothing_is_refused_with_the_models_there_are() {
    for bad in [
        "apu2",
        "claude",
        "x*",
        "gpt-4",
        "?",
        "????????",
        "colibri,gpt-5",
    ] {
        let list = ModelList::parse(bad).unwrap();
        let err = list.validate(&catalog()).unwrap_err();
        let entry = bad.rsplit(',').next().unwrap();
        assert_eq!(
            err,
            ModelListError::NamesNoModel {
                entry: entry.into(),
                slugs: vec!["colibri".into(), "aguila".into(), "apu".into()],
            },
            "{bad}"
        );
        assert_eq!(
            err.to_string(),
            format!("model list entry \"{entry}\" is not a model, an alias or a pattern that matches one; the models are colibri, aguila, apu")
        );
    }
}

#[test]
fn list_form_is_checked() {
    assert_eq!(
        ModelList::parse(" colibri ,aguila,colibri")
            .unwrap()
            .entries(),
        ["colibri", "aguila"]
    );
    assert_eq!(
        ModelList::new(["apu", "claude-*"]).unwrap().to_text(),
        "apu,claude-*"
    );
    let round = ModelList::parse("apu, claude-*").unwrap();
    assert_eq!(ModelList::parse(&round.to_text()), Ok(round.clone()));
    assert_eq!(round.to_string(), "apu, claude-*");
    assert_eq!(ModelList::parse(""), Err(ModelListError::EmptyEntry));
    assert_eq!(ModelList::parse("a,,b"), Err(ModelListError::EmptyEntry));
    assert_eq!(
        ModelList::new(Vec::<String>::new()),
        Err(ModelListError::EmptyEntry)
    );
    assert_eq!(
        ModelList::new(["colibri aguila"]),
        Err(ModelListError::BadCharacter("colibri aguila".into()))
    );
    assert_eq!(
        ModelList::new(["colibrí"]),
        Err(ModelListError::BadCharacter("colibrí".into()))
    );
    let long = "a".repeat(MAX_ENTRY_LEN + 1);
    assert_eq!(
        ModelList::new([long.as_str()]),
        Err(ModelListError::EntryTooLong(long.clone()))
    );
    let max: Vec<String> = (0..MAX_ENTRIES).map(|i| format!("m{i}")).collect();
    assert!(ModelList::new(&max).is_ok());
    let over: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("m{i}")).collect();
    assert_eq!(ModelList::new(&over), Err(ModelListError::TooMany));
}

#[test]
fn subsets_are_sets_of_models() {
    let limit = allowed("colibri, aguila");
    assert!(allowed("colibri").beyond(&limit).is_empty());
    // Written differently, the same models.
    assert!(allowed("claude-haiku-*, gpt-4o").beyond(&limit).is_empty());
    assert_eq!(allowed("*").beyond(&limit), ["apu"]);
    assert_eq!(allowed("claude-o*").beyond(&limit), ["apu"]);
}

#[test]
fn an_entry_that_no_longer_names_a_model_allows_nothing() {
    // Compiled against a catalog without apu (the operator removed it).
    let smaller = Catalog::new(vec!["colibri"], vec![]);
    let a = ModelList::parse("apu").unwrap().compile(&smaller);
    assert!(a.slugs().is_empty());
    assert_eq!(
        a.check("colibri", "colibri").unwrap_err().to_string(),
        "this key may use no configured model; not colibri"
    );
    assert_eq!(a.list().to_text(), "apu");
}

#[test]
fn the_shipped_configuration_resolves_as_the_gateway_does() {
    let config = Config::parse(EMBEDDED_DEFAULT, "embedded").unwrap();
    let cat = Catalog::of(&config);
    let a = ModelList::parse("claude-opus-*").unwrap().compile(&cat);
    assert_eq!(a.slugs(), ["apu"]);
    for name in [
        "claude-opus-4-5",
        "claude-sonnet-4-5",
        "claude-haiku-4-5",
        "colibri",
    ] {
        let slug = config.resolve_model(name).unwrap().slug.as_str();
        assert_eq!(a.check(name, slug).is_ok(), slug == "apu", "{name}");
    }
}
