//! Source positions of every node in a YAML document, by field path
//! (`kernel.fragments[1]`), so validation errors can point at line and column.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser};

/// 1-based line and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

/// Writes `file[:line:col]: [field: ]message`, the form every schema error
/// (recipe, provision.yaml) takes.
pub fn fmt_field_error(
    f: &mut std::fmt::Formatter<'_>,
    file: impl std::fmt::Display,
    position: Option<Position>,
    field: &str,
    message: &str,
) -> std::fmt::Result {
    write!(f, "{file}")?;
    if let Some(p) = position {
        write!(f, ":{}:{}", p.line, p.column)?;
    }
    if field.is_empty() {
        write!(f, ": {message}")
    } else {
        write!(f, ": {field}: {message}")
    }
}

#[derive(Clone, Debug, Default)]
pub struct Locations {
    nodes: HashMap<String, Position>,
}

impl Locations {
    /// The position of the value at `path`, or of its nearest located ancestor.
    pub fn find(&self, path: &str) -> Option<Position> {
        let mut path = path;
        loop {
            if let Some(p) = self.nodes.get(path) {
                return Some(*p);
            }
            let cut = path.rfind(['.', '['])?;
            path = &path[..cut];
        }
    }
}

enum Frame {
    Map { key: Option<String> },
    Seq { next: usize },
}

/// Records the position of every value node. Syntax errors simply end the
/// walk: the deserializer reports them with their own position.
pub fn locate(src: &str) -> Locations {
    let mut nodes = HashMap::new();
    let mut frames: Vec<(Frame, String)> = Vec::new();
    let mut parser = Parser::new_from_str(src);
    while let Some(Ok((event, span))) = parser.next_event() {
        let position = Position {
            line: span.start.line(),
            column: span.start.col() + 1,
        };
        match event {
            Event::Scalar(value, ..) => {
                if let Some((Frame::Map { key }, _)) = frames.last_mut()
                    && key.is_none()
                {
                    *key = Some(value.into_owned());
                    continue;
                }
                if let Some(path) = value_path(&mut frames) {
                    nodes.insert(path, position);
                }
            }
            Event::MappingStart(..) | Event::SequenceStart(..) => {
                let is_key = matches!(frames.last(), Some((Frame::Map { key: None }, _)));
                let path = if is_key {
                    // A complex key: its contents are not addressable by path.
                    "?".to_string()
                } else {
                    value_path(&mut frames).unwrap_or_default()
                };
                nodes.entry(path.clone()).or_insert(position);
                let frame = if matches!(event, Event::MappingStart(..)) {
                    Frame::Map { key: None }
                } else {
                    Frame::Seq { next: 0 }
                };
                frames.push((frame, path));
            }
            Event::MappingEnd | Event::SequenceEnd => {
                frames.pop();
            }
            _ => {}
        }
    }
    Locations { nodes }
}

/// The path of the value node that starts now, advancing the parent frame.
fn value_path(frames: &mut [(Frame, String)]) -> Option<String> {
    let (frame, parent) = frames.last_mut()?;
    let path = match frame {
        Frame::Map { key } => {
            let key = key.take()?;
            if parent.is_empty() {
                key
            } else {
                format!("{parent}.{key}")
            }
        }
        Frame::Seq { next } => {
            *next += 1;
            format!("{parent}[{}]", *next - 1)
        }
    };
    Some(path)
}

/// Splits a yaml_serde message `path: message at line L column C` into the
/// field path and the bare message (shared with the provision parser).
pub fn split_yaml_error(message: &str) -> (String, String) {
    let message = match message.rfind(" at line ") {
        Some(at) => &message[..at],
        None => message,
    };
    match message.split_once(": ") {
        Some((field, rest))
            if !field.is_empty()
                && field
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.[]".contains(&b)) =>
        {
            (field.to_string(), rest.to_string())
        }
        _ => (String::new(), message.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
name: x
kernel:
  source: { url: 'https://e/x.tar.xz', sha256: abc }
  fragments:
    - a.config
    - b.config
  cmdline: [quiet, 'isolcpus=1']
";

    #[test]
    fn block_and_flow_nodes() {
        let locations = locate(DOC);
        let at = |p: &str| {
            let pos = locations.find(p).unwrap();
            (pos.line, pos.column)
        };
        assert_eq!(at("name"), (1, 7));
        assert_eq!(at("kernel.source"), (3, 11));
        assert_eq!(at("kernel.source.sha256"), (3, 48));
        assert_eq!(at("kernel.fragments[1]"), (6, 7));
        assert_eq!(at("kernel.cmdline[1]"), (7, 20));
    }

    #[test]
    fn missing_paths_fall_back_to_the_parent() {
        let locations = locate(DOC);
        assert_eq!(
            locations.find("kernel.source.path"),
            locations.find("kernel.source")
        );
        assert_eq!(
            locations.find("kernel.fragments[9]"),
            locations.find("kernel.fragments")
        );
        assert_eq!(locations.find("nothing"), None);
    }

    #[test]
    fn garbage_does_not_panic() {
        let _ = locate("a: [b, {c: d");
        let _ = locate("? [complex]\n: value\n- x");
        let _ = locate("");
    }
}
