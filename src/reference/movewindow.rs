//! `docs/src/reference/movewindow.md`: the MoveWindow API, from the CRD the code derives
//! (`handoff::resources::move_window::crd()`, what `handoff crd` prints and
//! `manifests/base/movewindow-crd.yaml` holds), walking its `openAPIV3Schema`.

use serde_json::Value;

use super::{Table, code, header, text};

pub fn page() -> String {
    let crd = handoff::resources::move_window::crd();
    let spec = &crd.spec;
    assert_eq!(
        spec.versions.len(),
        1,
        "the MoveWindow reference shows one version; show each when there are more"
    );
    let version = &spec.versions[0];
    let schema = serde_json::to_value(
        version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("the CRD has a schema"),
    )
    .expect("a schema serializes");

    let mut out = header(
        "the CRD that src/resources/move_window.rs derives (`handoff crd`)",
        "movewindow",
        "reference::movewindow_md_is_current",
    );
    out.push_str("# The MoveWindow API\n\n");
    out.push_str(
        "The MoveWindow custom resource, as the CustomResourceDefinition that `handoff crd` \
         prints (and `manifests/base/movewindow-crd.yaml` holds) defines it. `handoff window` \
         and `handoff move` write it ([Commands and flags](cli.md)); the pin reads it.\n\n",
    );
    let mut about = Table::new(&["Property", "Value"]);
    about.row(vec!["Group".into(), code(&spec.group)]);
    let mut versions = vec![];
    if version.served {
        versions.push("served");
    }
    if version.storage {
        versions.push("storage");
    }
    about.row(vec![
        "Version".into(),
        format!("{} ({})", code(&version.name), versions.join(", ")),
    ]);
    about.row(vec!["Kind".into(), code(&spec.names.kind)]);
    if let Some(list) = &spec.names.list_kind {
        about.row(vec!["List kind".into(), code(list)]);
    }
    about.row(vec!["Plural".into(), code(&spec.names.plural)]);
    if let Some(singular) = &spec.names.singular {
        about.row(vec!["Singular".into(), code(singular)]);
    }
    let short = spec.names.short_names.clone().unwrap_or_default();
    if !short.is_empty() {
        about.row(vec![
            "Short names".into(),
            short.iter().map(|s| code(s)).collect::<Vec<_>>().join(", "),
        ]);
    }
    if let Some(categories) = spec.names.categories.as_ref().filter(|c| !c.is_empty()) {
        about.row(vec![
            "Categories".into(),
            categories
                .iter()
                .map(|s| code(s))
                .collect::<Vec<_>>()
                .join(", "),
        ]);
    }
    about.row(vec!["Scope".into(), spec.scope.clone()]);
    if let Some(sub) = &version.subresources {
        let mut names = Vec::new();
        if sub.status.is_some() {
            names.push(code("status"));
        }
        if sub.scale.is_some() {
            names.push(code("scale"));
        }
        if !names.is_empty() {
            about.row(vec!["Subresources".into(), names.join(", ")]);
        }
    }
    out.push_str(&about.render());

    if let Some(columns) = version
        .additional_printer_columns
        .as_ref()
        .filter(|c| !c.is_empty())
    {
        out.push_str("\n## Printer columns\n\n");
        out.push_str(&format!(
            "What `kubectl get {}` shows besides the name.\n\n",
            spec.names.plural
        ));
        let mut t = Table::new(&["Column", "Type", "JSON path", "Description"]);
        for c in columns {
            t.row(vec![
                c.name.clone(),
                c.type_.clone(),
                code(&c.json_path),
                c.description.as_deref().map(text).unwrap_or_default(),
            ]);
        }
        out.push_str(&t.render());
    }

    let required = required_of(&schema);
    for top in ["spec", "status"] {
        let Some(sub) = schema["properties"].get(top) else {
            continue;
        };
        out.push_str(&format!("\n## {top}\n\n"));
        if let Some(d) = sub["description"].as_str() {
            out.push_str(&text(d));
            out.push_str("\n\n");
        }
        if required.contains(&top.to_string()) {
            out.push_str(&format!("`{top}` is required.\n\n"));
        }
        let mut t = Table::new(&["Field", "Type", "Required", "Default", "Description"]);
        fields(top, sub, &mut t);
        out.push_str(&t.render());
    }
    for name in schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
    {
        assert!(
            ["apiVersion", "kind", "metadata", "spec", "status"].contains(&name.as_str()),
            "the MoveWindow reference shows spec and status: show {name:?} too"
        );
    }
    out
}

fn required_of(schema: &Value) -> Vec<String> {
    schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(String::from))
        .collect()
}

/// A row for each property of `schema` (an object), then for each of its own, depth first.
fn fields(path: &str, schema: &Value, t: &mut Table) {
    let required = required_of(schema);
    let Some(props) = schema["properties"].as_object() else {
        return;
    };
    for (name, prop) in props {
        let field = format!("{path}.{name}");
        t.row(vec![
            code(&field),
            type_of(&field, prop),
            if required.contains(name) { "yes" } else { "" }.into(),
            prop.get("default")
                .map(|d| code(&d.to_string()))
                .unwrap_or_default(),
            prop["description"].as_str().map(text).unwrap_or_default(),
        ]);
        match prop["type"].as_str() {
            Some("object") => fields(&field, prop, t),
            Some("array") if prop["items"]["type"] == "object" => {
                fields(&format!("{field}[]"), &prop["items"], t)
            }
            _ => {}
        }
    }
}

/// `string`, `integer (int32)`, `array of string`, `map of string`, `string: `Open`, ...`.
fn type_of(path: &str, prop: &Value) -> String {
    if prop["x-kubernetes-int-or-string"] == true {
        return "integer or string".into();
    }
    let Some(ty) = prop["type"].as_str() else {
        panic!("{path}: no type in the CRD, and the MoveWindow reference cannot show it: {prop}");
    };
    let mut out = match ty {
        "array" => format!("array of {}", type_of(&format!("{path}[]"), &prop["items"])),
        "object" => match &prop["additionalProperties"] {
            Value::Object(_) => format!(
                "map of {}",
                type_of(&format!("{path}.*"), &prop["additionalProperties"])
            ),
            _ if prop["x-kubernetes-preserve-unknown-fields"] == true => {
                "object (any fields)".into()
            }
            _ => "object".into(),
        },
        "string" | "integer" | "number" | "boolean" => ty.to_string(),
        other => panic!("{path}: type {other:?}, which the MoveWindow reference does not show"),
    };
    if let Some(f) = prop["format"].as_str() {
        out.push_str(&format!(" ({f})"));
    }
    if let Some(values) = prop["enum"].as_array() {
        let values: Vec<String> = values
            .iter()
            .map(|v| {
                code(
                    v.as_str()
                        .map_or_else(|| v.to_string(), String::from)
                        .as_str(),
                )
            })
            .collect();
        out.push_str(&format!(": {}", values.join(", ")));
    }
    out
}
