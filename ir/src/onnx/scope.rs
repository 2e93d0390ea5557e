//! The PyTorch module a node came from (`features.0`, `transformer.h.3.mlp.c_fc`), as the
//! exporters record it, so that a plan can name layers the way their author does.
//!
//! * The dynamo exporter (`torch.onnx.export(..., dynamo=True)`) writes node metadata:
//!   `pkg.torch.onnx.name_scopes` is a Python list of the enclosing modules' full paths,
//!   outermost first, then the FX node's own name (`['', 'blocks.3', 'blocks.3.out',
//!   'linear_15']`); `namespace` says the same as `path: class` pairs joined by `/`.
//! * The TorchScript exporter names nodes by scope: `/features/features.0/Conv`, or
//!   `/bert/encoder/layer.0/attention/self/query/MatMul`. Each component is a module's name
//!   relative to the closest enclosing module that was *called* (a `ModuleList` never is,
//!   so its index joins the child's name: `layer.0`); a `Sequential`'s child is written with
//!   the parent's name in front (`features.0` under `features`).

use onnx_protobuf::NodeProto;

/// The module path of `node` named `name`: empty when the export does not say or the node
/// belongs to the root module.
pub(crate) fn module_path(node: &NodeProto, name: &str) -> String {
    without_call_counts(&recorded_path(node, name))
}

/// `path` with the exporter's call counts removed: torch.export names a module's second
/// call `act@1` (its `nn_module_stack`), but the module, which a plan applies to, is `act`.
fn without_call_counts(path: &str) -> String {
    path.split('.')
        .map(|part| match part.rsplit_once('@') {
            Some((module, count)) if count.bytes().all(|b| b.is_ascii_digit()) => module,
            _ => part,
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// The module path as the export records it.
fn recorded_path(node: &NodeProto, name: &str) -> String {
    let meta = |key: &str| {
        node.metadata_props
            .iter()
            .find(|p| p.key == key)
            .map(|p| p.value.as_str())
    };
    if let Some(scopes) = meta("pkg.torch.onnx.name_scopes").and_then(python_strings) {
        // The last entry is the FX node; the one before it, the innermost module.
        return match scopes.len() {
            0 | 1 => String::new(),
            n => scopes[n - 2].clone(),
        };
    }
    if let Some(namespace) = meta("namespace") {
        let paths: Vec<&str> = namespace
            .split('/')
            .map(|part| part.split(':').next().unwrap_or("").trim())
            .collect();
        if paths.len() >= 2 {
            return paths[paths.len() - 2].to_owned();
        }
    }
    torchscript_path(name)
}

/// The module path in a TorchScript exporter's node name (`/features/features.0/Conv` is
/// `features.0`); empty for a name that is not a scope path.
fn torchscript_path(name: &str) -> String {
    let Some(scoped) = name.strip_prefix('/') else {
        return String::new();
    };
    let mut components: Vec<&str> = scoped.split('/').filter(|c| !c.is_empty()).collect();
    components.pop(); // the op's own name
    let mut path: Vec<&str> = Vec::new();
    for c in components {
        // `features.0` under `features`: the child of a Sequential, parent written in front.
        match path.last() {
            Some(&parent) if c.strip_prefix(parent).is_some_and(|r| r.starts_with('.')) => {
                *path.last_mut().expect("checked: non-empty") = c;
            }
            _ => path.push(c),
        }
    }
    path.join(".")
}

/// The strings of a Python list literal of strings (`['', 'a.b']`), or `None` when `text`
/// is not one.
fn python_strings(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('[')?.strip_suffix(']')?;
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace() || *c == ',').is_some() {}
        let Some(quote) = chars.next() else {
            return Some(out);
        };
        if quote != '\'' && quote != '"' {
            return None;
        }
        let mut s = String::new();
        loop {
            match chars.next()? {
                '\\' => s.push(chars.next()?),
                c if c == quote => break,
                c => s.push(c),
            }
        }
        out.push(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_meta(pairs: &[(&str, &str)]) -> NodeProto {
        let mut node = NodeProto::new();
        for (k, v) in pairs {
            let mut p = onnx_protobuf::StringStringEntryProto::new();
            p.key = (*k).into();
            p.value = (*v).into();
            node.metadata_props.push(p);
        }
        node
    }

    #[test]
    fn dynamo_name_scopes_name_the_innermost_module() {
        let node = with_meta(&[(
            "pkg.torch.onnx.name_scopes",
            "['', 'blocks.3', 'blocks.3.out', 'linear_15']",
        )]);
        assert_eq!(module_path(&node, "node_MatMul_176"), "blocks.3.out");
        // A module called twice is still one module.
        let again = with_meta(&[(
            "pkg.torch.onnx.name_scopes",
            "['', 'blocks.1@1', 'blocks.1@1.act@2', 'relu_3']",
        )]);
        assert_eq!(module_path(&again, "node_relu_3"), "blocks.1.act");
        let root = with_meta(&[("pkg.torch.onnx.name_scopes", "['', 'add_3']")]);
        assert_eq!(module_path(&root, "node_add_3"), "");
    }

    #[test]
    fn dynamo_namespace_when_there_are_no_name_scopes() {
        let node = with_meta(&[(
            "namespace",
            ": __main__.Gpt2/wte: torch.nn.modules.sparse.Embedding/embedding: aten.embedding.default",
        )]);
        assert_eq!(module_path(&node, "node_embedding"), "wte");
    }

    #[test]
    fn torchscript_scopes_join_relative_names() {
        let node = NodeProto::new();
        assert_eq!(
            module_path(&node, "/features/features.0/Conv"),
            "features.0"
        );
        assert_eq!(
            module_path(&node, "/bert/encoder/layer.0/attention/self/query/MatMul"),
            "bert.encoder.layer.0.attention.self.query"
        );
        assert_eq!(module_path(&node, "/Add_1"), "");
        assert_eq!(module_path(&node, "conv0"), "");
    }

    #[test]
    fn malformed_scope_lists_fall_back() {
        assert_eq!(python_strings("['a', 'b"), None);
        assert_eq!(python_strings("[a]"), None);
        assert_eq!(
            python_strings(r#"['', "x\"y"]"#),
            Some(vec![String::new(), "x\"y".into()])
        );
        let node = with_meta(&[("pkg.torch.onnx.name_scopes", "not a list")]);
        assert_eq!(module_path(&node, "/m/Relu"), "m");
    }
}
