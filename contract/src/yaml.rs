//! Source positions of every node in a YAML document, by field path
//! (`kernel.fragments[1]`), so validation errors can point at line and column;
//! and [`check_bounds`], the guard every YAML file passes before it is
//! deserialized (nesting depth, size with aliases expanded).

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

/// How far a YAML document may reach once parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Collections open inside each other.
    pub depth: usize,
    /// The expanded size: one unit per node plus the bytes of every scalar,
    /// each alias counted as a full copy of the node it names.
    pub expanded: u64,
}

/// The limits of recipes and `provision.yaml`: far above any real file,
/// far below what costs a parser memory or time.
pub const LIMITS: Limits = Limits {
    depth: 64,
    expanded: 1024 * 1024,
};

/// Why a document was refused before deserialization.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("the document nests deeper than the limit of {limit} levels")]
    TooDeep { position: Position, limit: usize },
    #[error(
        "aliases expand the document beyond the limit of {limit} (one unit per node and per byte of text, each alias counted as a copy of the node it names)"
    )]
    TooLarge { position: Position, limit: u64 },
    #[error("{message}")]
    Syntax { position: Position, message: String },
}

impl BoundsError {
    pub fn position(&self) -> Position {
        match self {
            BoundsError::TooDeep { position, .. }
            | BoundsError::TooLarge { position, .. }
            | BoundsError::Syntax { position, .. } => *position,
        }
    }
}

/// Refuses, before anything deserializes `text`, a document nested deeper
/// than `limits.depth` or whose expanded size exceeds `limits.expanded`.
/// One pass over the parser's events, stopping at the first excess, so the
/// cost is linear in the text. A syntax error is refused here too: no part
/// of the text reaches a deserializer unchecked.
pub fn check_bounds(text: &str, limits: Limits) -> Result<(), BoundsError> {
    let mut walk = BoundsWalk {
        limits,
        total: 0,
        open: Vec::new(),
        anchored: HashMap::new(),
    };
    let mut parser = Parser::new_from_str(text);
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| scan_error(&e, limits))?;
        walk.event(&event, marker_position(&span.start))?;
    }
    Ok(())
}

/// The parser's own error. Its scanner reads ahead on a line, and refuses
/// more than 255 open flow collections itself ("recursion limit exceeded"):
/// that is this guard's depth refusal, reached first.
fn scan_error(error: &saphyr_parser::ScanError, limits: Limits) -> BoundsError {
    let position = marker_position(error.marker());
    match error.info() {
        "recursion limit exceeded" => BoundsError::TooDeep {
            position,
            limit: limits.depth,
        },
        info => BoundsError::Syntax {
            position,
            message: info.to_string(),
        },
    }
}

fn marker_position(marker: &saphyr_parser::Marker) -> Position {
    Position {
        line: marker.line(),
        column: marker.col() + 1,
    }
}

/// The running count of [`check_bounds`].
struct BoundsWalk {
    limits: Limits,
    /// The expanded size so far.
    total: u64,
    /// Per open collection: `total` when it began, and its anchor id (0: none).
    open: Vec<(u64, usize)>,
    /// The expanded size of every anchored node that is complete, by anchor id.
    anchored: HashMap<usize, u64>,
}

impl BoundsWalk {
    fn event(&mut self, event: &Event, at: Position) -> Result<(), BoundsError> {
        match event {
            Event::Scalar(value, _, anchor, _) => {
                let size = 1 + value.len() as u64;
                self.anchor(*anchor, size);
                self.add(size, at)
            }
            // An alias of an incomplete node (a cycle) counts as one node.
            Event::Alias(anchor) => self.add(self.anchored.get(anchor).copied().unwrap_or(1), at),
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if self.open.len() >= self.limits.depth {
                    return Err(BoundsError::TooDeep {
                        position: at,
                        limit: self.limits.depth,
                    });
                }
                self.open.push((self.total, *anchor));
                self.add(1, at)
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((start, anchor)) = self.open.pop() {
                    self.anchor(anchor, self.total - start);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn anchor(&mut self, anchor: usize, size: u64) {
        if anchor != 0 {
            self.anchored.insert(anchor, size);
        }
    }

    fn add(&mut self, size: u64, at: Position) -> Result<(), BoundsError> {
        self.total = self.total.saturating_add(size);
        if self.total > self.limits.expanded {
            return Err(BoundsError::TooLarge {
                position: at,
                limit: self.limits.expanded,
            });
        }
        Ok(())
    }
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

    /// Ten anchors, each a list of ten aliases of the one before: 10^9
    /// scalars once expanded, in about a kilobyte.
    fn billion_laughs() -> String {
        let mut doc = "a0: &a0 lol\n".to_string();
        for level in 1..10 {
            let aliases = vec![format!("*a{}", level - 1); 10].join(", ");
            doc += &format!("a{level}: &a{level} [{aliases}]\n");
        }
        doc
    }

    #[test]
    fn billion_laughs_is_refused_by_its_expanded_size() {
        let doc = billion_laughs();
        assert!(doc.len() < 2048, "{}", doc.len());
        let e = check_bounds(&doc, LIMITS).unwrap_err();
        assert!(
            matches!(e, BoundsError::TooLarge { limit: 1_048_576, .. }),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("aliases expand the document beyond the limit of 1048576"),
            "{e}"
        );
        // The alias that crosses the limit, on a line of its own.
        assert!(e.position().line > 1, "{e:?}");
    }

    #[test]
    fn ten_thousand_nested_lists_are_refused_at_the_depth_limit() {
        let one_line = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        let e = check_bounds(&one_line, LIMITS).unwrap_err();
        assert!(matches!(e, BoundsError::TooDeep { limit: 64, .. }), "{e:?}");
        assert!(
            e.to_string().contains("nests deeper than the limit of 64 levels"),
            "{e}"
        );
        assert_eq!(e.position().line, 1);
        // Block nesting: the 65th sequence, on line 65, is the one refused.
        let block = (0..200)
            .map(|i| format!("{}- \n", "  ".repeat(i)))
            .collect::<String>();
        assert_eq!(
            check_bounds(&block, LIMITS).unwrap_err(),
            BoundsError::TooDeep {
                position: Position {
                    line: 65,
                    column: 129
                },
                limit: 64
            }
        );
    }

    #[test]
    fn the_limits_are_inclusive_and_benign_aliases_pass() {
        let deep = format!("{}{}", "[".repeat(64), "]".repeat(64));
        check_bounds(&deep, LIMITS).unwrap();
        check_bounds(DOC, LIMITS).unwrap();
        check_bounds("base: &b {a: 1, b: [x, y]}\ncopy: *b\n", LIMITS).unwrap();
        // `a: &a xy` is 3 units; 4 aliases of it with the key scalars fit in 20.
        let small = Limits {
            depth: 2,
            expanded: 20,
        };
        check_bounds("a: &a xy\nb: [*a, *a, *a]\n", small).unwrap();
        let e = check_bounds("a: &a xy\nb: [*a, *a, *a, *a]\n", small).unwrap_err();
        assert_eq!(e.position(), Position { line: 2, column: 17 }, "{e:?}");
    }

    #[test]
    fn syntax_errors_are_refused_with_their_position() {
        let e = check_bounds("a: [b, c\nd: e\n", LIMITS).unwrap_err();
        assert!(matches!(e, BoundsError::Syntax { .. }), "{e:?}");
        assert!(e.position().line >= 2, "{e:?}");
    }

    #[test]
    fn garbage_does_not_panic() {
        let _ = locate("a: [b, {c: d");
        let _ = locate("? [complex]\n: value\n- x");
        let _ = locate("");
    }
}
