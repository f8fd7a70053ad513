//! `docs/src/reference/config.md`: the `--config` file, from the JSON Schema that schemars
//! derives from `handoff::config::ConfigFile` (its doc comments are the descriptions, its
//! `Default` the defaults, serde's names the fields).

use serde_json::Value;

use super::{Table, code, header, text};
use handoff::config::ConfigFile;

/// A file that sets every field (parsed by `the_example_parses_and_sets_every_field`).
const EXAMPLE: &str = "\
syncTargets:                           # checked before the kcp convention
  - username: system:serviceaccount:edge:syncer
    key: 6ohB8yeXhwqTQVuBzJRgqcRJTpRjX7yTZu5g5g
  - username: legacy-syncer
    cluster: root:org:ws
    name: us-west1
annotationDomains: [kcp.io, kcp.dev]   # the default: both
keySchemes: [current, legacy]          # the default: both
enforcement:                           # enforce, warn or audit; re-read on change
  syncFinalizer: enforce
  moveWindow: enforce
exemptions:                            # break-glass; re-read on change
  - group: move-breakglass
  - username: alice@example.com
";

fn schema() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    serde_json::to_value(generator.into_root_schema_for::<ConfigFile>())
        .expect("a schema serializes")
}

pub fn page() -> String {
    let schema = schema();
    let mut out = header(
        "the config types of src/config.rs (their JSON Schema)",
        "config",
        "reference::config_md_is_current",
    );
    out.push_str("# The config file\n\n");
    if let Some(d) = schema["description"].as_str() {
        out.push_str(&text(d));
        out.push_str("\n\n");
    }
    out.push_str("## Example\n\n```yaml\n");
    out.push_str(EXAMPLE);
    out.push_str("```\n\n## Fields\n\n");
    out.push_str(
        "A path such as `syncTargets[].key` is a field of each entry of a list. A field left \
         out takes its default.\n\n",
    );
    let mut t = Table::new(&["Field", "Type", "Default", "Values", "Description"]);
    fields("", &schema, &mut t);
    out.push_str(&t.render());
    out
}

fn fields(path: &str, schema: &Value, t: &mut Table) {
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    for (name, prop) in props {
        let field = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let ty = type_of(&field, prop);
        let items = &prop["items"];
        let mut description = prop["description"].as_str().map(text).unwrap_or_default();
        // A list's entries: what each one is.
        if let Some(d) = items["description"]
            .as_str()
            .filter(|_| ty == "array of object")
        {
            let mut chars = d.chars();
            let d: String = match (chars.next(), chars.next()) {
                // "One exempt identity" after "Each entry:".
                (Some(a), Some(b)) if a.is_uppercase() && b.is_lowercase() => {
                    a.to_lowercase().chain(d.chars().skip(1)).collect()
                }
                _ => d.to_string(),
            };
            description = format!("{description} Each entry: {}", text(&d));
        }
        let enumerated = if values_of(prop).is_empty() {
            items
        } else {
            prop
        };
        let values = values_of(enumerated);
        let meanings: Vec<String> = values
            .iter()
            .filter_map(|(v, d)| d.as_ref().map(|d| format!("{}: {}", code(v), text(d))))
            .collect();
        if !meanings.is_empty() {
            description = format!("{description} {}", meanings.join(" "));
        }
        let default = if required.contains(&name.as_str()) {
            "required".to_string()
        } else {
            match &prop["default"] {
                Value::Null | Value::Object(_) => String::new(),
                d => code(&yaml_flow(d)),
            }
        };
        t.row(vec![
            code(&field),
            ty.clone(),
            default,
            values
                .iter()
                .map(|(v, _)| code(v))
                .collect::<Vec<_>>()
                .join(", "),
            description.trim().to_string(),
        ]);
        if ty == "object" {
            fields(&field, prop, t);
        } else if ty == "array of object" {
            fields(&format!("{field}[]"), items, t);
        }
    }
}

/// The JSON type, without the `null` an `Option` adds.
fn type_of(path: &str, prop: &Value) -> String {
    let mut types: Vec<&str> = match &prop["type"] {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ if !values_of(prop).is_empty() => vec!["string"],
        other => panic!("{path}: no type ({other}) that the config reference can show: {prop}"),
    };
    types.retain(|t| *t != "null");
    match types.as_slice() {
        ["array"] => format!("array of {}", type_of(&format!("{path}[]"), &prop["items"])),
        [one] => one.to_string(),
        more => panic!("{path}: one of {more:?}, which the config reference does not show"),
    }
}

/// An enumeration's values, each with its doc comment if it has one: schemars writes `enum`,
/// or a `oneOf` of `const`s when the variants are documented.
fn values_of(prop: &Value) -> Vec<(String, Option<String>)> {
    if let Some(values) = prop["enum"].as_array() {
        return values.iter().map(|v| (yaml_flow(v), None)).collect();
    }
    let Some(variants) = prop["oneOf"].as_array() else {
        return Vec::new();
    };
    variants
        .iter()
        .map(|v| {
            let value = v
                .get("const")
                .unwrap_or_else(|| panic!("a oneOf that is not an enumeration: {prop}"));
            (
                yaml_flow(value),
                v["description"].as_str().map(String::from),
            )
        })
        .collect()
}

/// A default as YAML's flow style writes it: `[kcp.io, kcp.dev]`, `enforce`, `[]`.
fn yaml_flow(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(yaml_flow).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

#[test]
fn the_example_parses_and_sets_every_field() {
    let cfg = ConfigFile::parse(EXAMPLE).expect("the example parses");
    assert_eq!(cfg.sync_targets.len(), 2);
    assert_eq!(cfg.exemptions.len(), 2);
    let schema = schema();
    let value: Value =
        serde_json::to_value(handoff::yaml::from_str::<serde_json::Value>(EXAMPLE).unwrap())
            .unwrap();
    for field in schema["properties"].as_object().unwrap().keys() {
        assert!(
            value.get(field).is_some(),
            "the example in src/reference/config.rs leaves out {field}"
        );
    }
}

#[test]
fn the_schema_defaults_are_what_an_empty_file_means() {
    // The page's defaults come from the schema; the behaviour from `ConfigFile::default()`.
    let empty = serde_json::to_value(ConfigFile::parse("").unwrap()).unwrap();
    for (field, prop) in schema()["properties"].as_object().unwrap() {
        assert_eq!(prop["default"], empty[field], "{field}");
    }
}
