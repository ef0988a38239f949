//! Explains why Kconfig dropped a symbol: the `depends on` conditions of its
//! definition (including enclosing `if`, `menu` and `choice` blocks) that do
//! not hold in the final configuration.
//!
//! The Kconfig tree is walked from the top-level `Kconfig` following
//! `source`/`rsource`/`osource`; file reading is injected so the parser stays
//! pure and testable.

use std::path::{Path, PathBuf};

use rtcheck::kconfig::{Config, Value};

/// One definition of a symbol (`config X` may appear in several places).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Definition {
    pub file: PathBuf,
    pub line: usize,
    /// Every condition that must hold for the symbol to be settable.
    pub conditions: Vec<String>,
}

#[derive(Default)]
struct Walk<'a> {
    symbol: &'a str,
    found: Vec<Definition>,
    /// Conditions of the enclosing `if`/`menu`/`choice` blocks.
    blocks: Vec<Block>,
}

#[derive(Clone, Debug)]
enum Block {
    If(String),
    Menu(Vec<String>),
    Choice(Vec<String>),
}

impl Block {
    fn conditions(&self) -> Vec<String> {
        match self {
            Block::If(c) => vec![c.clone()],
            Block::Menu(c) | Block::Choice(c) => c.clone(),
        }
    }
}

const ENTRY_KEYWORDS: &[&str] = &[
    "config",
    "menuconfig",
    "choice",
    "endchoice",
    "menu",
    "endmenu",
    "if",
    "endif",
    "source",
    "rsource",
    "osource",
    "orsource",
    "comment",
    "mainmenu",
];

fn first_word(line: &str) -> &str {
    line.split_whitespace().next().unwrap_or_default()
}

/// Collapses runs of whitespace (continuation lines leave tabs inside).
fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn unquote(text: &str) -> &str {
    text.trim().trim_matches('"')
}

/// Finds every definition of `symbol` (without `CONFIG_`) reachable from the
/// top-level `Kconfig` of `srctree`. `read` returns a file's text, or `None`.
pub fn find_definitions(
    srctree: &Path,
    srcarch: &str,
    symbol: &str,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Vec<Definition> {
    let mut walk = Walk {
        symbol,
        ..Walk::default()
    };
    walk_file(&mut walk, srctree, srcarch, Path::new("Kconfig"), read, 0);
    walk.found
}

fn walk_file(
    walk: &mut Walk,
    srctree: &Path,
    srcarch: &str,
    rel: &Path,
    read: &dyn Fn(&Path) -> Option<String>,
    depth: usize,
) {
    if depth > 32 {
        return;
    }
    let Some(text) = read(&srctree.join(rel)) else {
        return;
    };
    // Join continuation lines, remembering the first line number of each.
    let mut lines: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let (number, mut joined) = pending.take().unwrap_or((i + 1, String::new()));
        if let Some(stripped) = raw.strip_suffix('\\') {
            joined.push_str(stripped);
            pending = Some((number, joined));
        } else {
            joined.push_str(raw);
            lines.push((number, joined));
        }
    }
    let mut in_help: Option<usize> = None;
    let mut entry: Option<Definition> = None;
    let mut index = 0;
    while index < lines.len() {
        let (number, line) = &lines[index];
        index += 1;
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if let Some(help_indent) = in_help {
            if trimmed.is_empty() || indent > help_indent {
                continue;
            }
            in_help = None;
        }
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let keyword = first_word(trimmed);
        let rest = trimmed[keyword.len()..].trim();
        if ENTRY_KEYWORDS.contains(&keyword)
            && let Some(done) = entry.take()
        {
            walk.found.push(done);
        }
        match keyword {
            "config" | "menuconfig" if rest == walk.symbol => {
                let conditions = walk.blocks.iter().flat_map(Block::conditions).collect();
                entry = Some(Definition {
                    file: rel.to_path_buf(),
                    line: *number,
                    conditions,
                });
            }
            "if" => walk.blocks.push(Block::If(squash(rest))),
            "endif" | "endmenu" | "endchoice" => {
                walk.blocks.pop();
            }
            "menu" | "choice" => {
                // Collect the block's own `depends on` lines that follow it.
                let mut conditions = Vec::new();
                while let Some((_, next)) = lines.get(index) {
                    let next = next.trim();
                    if next.is_empty() || next.starts_with('#') {
                        index += 1;
                        continue;
                    }
                    let word = first_word(next);
                    if ENTRY_KEYWORDS.contains(&word) {
                        break;
                    }
                    if let Some(cond) = next.strip_prefix("depends on") {
                        conditions.push(squash(cond));
                    }
                    index += 1;
                }
                walk.blocks.push(if keyword == "menu" {
                    Block::Menu(conditions)
                } else {
                    Block::Choice(conditions)
                });
            }
            "source" | "rsource" | "osource" | "orsource" => {
                let target = unquote(rest)
                    .replace("$(SRCARCH)", srcarch)
                    .replace("$SRCARCH", srcarch)
                    .replace("$(srctree)/", "");
                let path = if keyword.starts_with("r") || keyword.starts_with("or") {
                    rel.parent().unwrap_or(Path::new("")).join(&target)
                } else {
                    PathBuf::from(&target)
                };
                walk_file(walk, srctree, srcarch, &path, read, depth + 1);
            }
            "help" | "---help---" => in_help = Some(indent),
            "depends" => {
                if let (Some(def), Some(cond)) = (entry.as_mut(), rest.strip_prefix("on")) {
                    def.conditions.push(squash(cond));
                }
            }
            "bool" | "tristate" | "string" | "int" | "hex" | "prompt" => {
                // `bool "prompt" if COND` makes the prompt (settability) conditional.
                if let Some(def) = entry.as_mut()
                    && let Some(cond) = prompt_condition(rest)
                {
                    def.conditions.push(cond);
                }
            }
            _ => {}
        }
    }
    if let Some(done) = entry.take() {
        walk.found.push(done);
    }
}

/// The `if COND` after a quoted prompt.
fn prompt_condition(rest: &str) -> Option<String> {
    let after_prompt = if let Some(stripped) = rest.strip_prefix('"') {
        let close = stripped.find('"')?;
        &stripped[close + 1..]
    } else {
        rest
    };
    after_prompt.trim().strip_prefix("if ").map(squash)
}

/// Tristate values: n=0, m=1, y=2.
fn tristate(value: &str) -> u8 {
    match value {
        "y" => 2,
        "m" => 1,
        _ => 0,
    }
}

fn symbol_value(config: &Config, token: &str) -> String {
    match token {
        "y" | "m" | "n" => return token.to_string(),
        _ => {}
    }
    if token.starts_with('"') {
        return unquote(token).to_string();
    }
    if token
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_digit() || b == b'-')
    {
        return token.to_string();
    }
    match config.get(&format!("CONFIG_{token}")) {
        Some(Value::Yes) => "y".into(),
        Some(Value::Module) => "m".into(),
        Some(Value::Str(s)) => s.clone(),
        Some(Value::Number(n)) => n.clone(),
        Some(Value::NotSet) | None => "n".into(),
    }
}

fn tokenize(expr: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let two: String = chars[i..chars.len().min(i + 2)].iter().collect();
        if c.is_whitespace() {
            i += 1;
        } else if ["&&", "||", "!=", "<=", ">="].contains(&two.as_str()) {
            tokens.push(two);
            i += 2;
        } else if "()!=<>".contains(c) {
            tokens.push(c.to_string());
            i += 1;
        } else if c == '"' {
            let end = chars[i + 1..]
                .iter()
                .position(|&d| d == '"')
                .map_or(chars.len(), |p| i + 2 + p);
            tokens.push(chars[i..end.min(chars.len())].iter().collect());
            i = end;
        } else {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || "_-.$".contains(chars[i])) {
                i += 1;
            }
            if i == start {
                i += 1; // skip an unexpected character
            } else {
                tokens.push(chars[start..i].iter().collect());
            }
        }
    }
    tokens
}

/// A value as Kconfig compares it: `n`/`m`/`y` in tristate order, decimal
/// and `0x` hex as numbers, anything else as a string.
fn numeric(value: &str) -> Option<i128> {
    match value {
        "n" => return Some(0),
        "m" => return Some(1),
        "y" => return Some(2),
        _ => {}
    }
    let (negative, digits) = match value.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, value),
    };
    let magnitude = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => i128::from_str_radix(hex, 16).ok()?,
        None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => digits.parse().ok()?,
        None => return None,
    };
    Some(if negative { -magnitude } else { magnitude })
}

/// `left <op> right` the way Kconfig's `expr_calc_value` does it: numerically
/// when both sides are numbers, else by string order.
fn compare(op: &str, left: &str, right: &str) -> bool {
    use std::cmp::Ordering;
    let order = match (numeric(left), numeric(right)) {
        (Some(l), Some(r)) => l.cmp(&r),
        _ => left.cmp(right),
    };
    match op {
        "=" => order == Ordering::Equal,
        "!=" => order != Ordering::Equal,
        "<" => order == Ordering::Less,
        ">" => order == Ordering::Greater,
        "<=" => order != Ordering::Greater,
        ">=" => order != Ordering::Less,
        _ => false,
    }
}

struct Evaluator<'a> {
    tokens: Vec<String>,
    pos: usize,
    config: &'a Config,
    /// Atoms (symbols or comparisons) that evaluated to n.
    unmet: Vec<String>,
}

impl Evaluator<'_> {
    fn peek(&self) -> Option<&str> {
        self.tokens.get(self.pos).map(String::as_str)
    }

    fn or(&mut self) -> u8 {
        let mut value = self.and();
        while self.peek() == Some("||") {
            self.pos += 1;
            value = value.max(self.and());
        }
        value
    }

    fn and(&mut self) -> u8 {
        let mut value = self.not();
        while self.peek() == Some("&&") {
            self.pos += 1;
            value = value.min(self.not());
        }
        value
    }

    fn not(&mut self) -> u8 {
        if self.peek() == Some("!") {
            self.pos += 1;
            let (first_token, first_unmet) = (self.pos, self.unmet.len());
            let value = 2 - self.not();
            // Under a negation, an unmet inner atom is what made it true.
            self.unmet.truncate(first_unmet);
            if value == 0 {
                let inner = self.tokens[first_token..self.pos].join(" ");
                self.unmet.push(format!("!{inner} ({inner} is set)"));
            }
            return value;
        }
        self.primary()
    }

    fn primary(&mut self) -> u8 {
        let Some(token) = self.peek().map(str::to_string) else {
            return 0;
        };
        self.pos += 1;
        if token == "(" {
            let value = self.or();
            if self.peek() == Some(")") {
                self.pos += 1;
            }
            return value;
        }
        let left = symbol_value(self.config, &token);
        if let Some(op) = self
            .peek()
            .filter(|t| ["=", "!=", "<", ">", "<=", ">="].contains(t))
            .map(str::to_string)
        {
            self.pos += 1;
            let right_token = self.peek().unwrap_or_default().to_string();
            self.pos += 1;
            let right = symbol_value(self.config, &right_token);
            let holds = compare(&op, &left, &right);
            if !holds {
                self.unmet
                    .push(format!("{token}{op}{right_token} ({token} is {left})"));
            }
            return if holds { 2 } else { 0 };
        }
        let value = tristate(&left);
        if value == 0 {
            self.unmet.push(format!("{token} (is {left})"));
        }
        value
    }
}

/// Evaluates a Kconfig expression against `config`; returns the tristate
/// value and the atoms that were not satisfied.
pub fn evaluate(expr: &str, config: &Config) -> (u8, Vec<String>) {
    let mut evaluator = Evaluator {
        tokens: tokenize(expr),
        pos: 0,
        config,
        unmet: Vec::new(),
    };
    let value = evaluator.or();
    (value, evaluator.unmet)
}

/// A sentence naming the unmet dependencies of `symbol` (without `CONFIG_`),
/// or `None` when every condition holds (the symbol was changed by a
/// `select`, a choice, or a range instead).
pub fn explain(definitions: &[Definition], symbol: &str, config: &Config) -> Option<String> {
    let mut reasons = Vec::new();
    for definition in definitions {
        for condition in &definition.conditions {
            let (value, unmet) = evaluate(condition, config);
            if value == 0 {
                reasons.push(format!(
                    "{symbol} depends on `{condition}` ({}:{}), unmet: {}",
                    definition.file.display(),
                    definition.line,
                    if unmet.is_empty() {
                        "the expression is n".to_string()
                    } else {
                        unmet.join(", ")
                    }
                ));
            }
        }
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn tree(files: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (Path::new("/src").join(p), t.to_string()))
            .collect();
        move |p: &Path| map.get(p).cloned()
    }

    const TOP: &str =
        "mainmenu \"Linux\"\nsource \"kernel/Kconfig.preempt\"\nsource \"arch/$(SRCARCH)/Kconfig\"\n";
    const PREEMPT: &str = "\
choice
\tprompt \"Preemption Model\"
\tdefault PREEMPT_NONE

config PREEMPT_NONE
\tbool \"No Forced Preemption (Server)\"
\thelp
\t  config PREEMPT_RT is mentioned in help text
\t  and must not start an entry.

endchoice

config PREEMPT_RT
\tbool \"Fully Preemptible Kernel (Real-Time)\"
\tdepends on EXPERT && ARCH_SUPPORTS_RT
\tselect PREEMPTION
\thelp
\t  This option turns the kernel into a real-time kernel.

if NET
config E1000E
\ttristate \"Intel PRO/1000\" if PCI_QUIRKS
\tdepends on PCI && \\
\t   (X86 || !ARM)
endif
";

    #[test]
    fn finds_definitions_with_block_conditions() {
        let read = tree(&[
            ("Kconfig", TOP),
            ("kernel/Kconfig.preempt", PREEMPT),
            ("arch/x86/Kconfig", "config X86\n\tdef_bool y\n"),
        ]);
        let defs = find_definitions(Path::new("/src"), "x86", "PREEMPT_RT", &read);
        assert_eq!(defs.len(), 1);
        assert_eq!(defs[0].file, PathBuf::from("kernel/Kconfig.preempt"));
        assert_eq!(defs[0].line, 13);
        assert_eq!(defs[0].conditions, vec!["EXPERT && ARCH_SUPPORTS_RT".to_string()]);

        let defs = find_definitions(Path::new("/src"), "x86", "E1000E", &read);
        assert_eq!(
            defs[0].conditions,
            vec![
                "NET".to_string(),
                "PCI_QUIRKS".to_string(),
                "PCI && (X86 || !ARM)".to_string()
            ]
        );
    }

    #[test]
    fn explains_the_blocking_dependency() {
        let read = tree(&[("Kconfig", TOP), ("kernel/Kconfig.preempt", PREEMPT)]);
        let defs = find_definitions(Path::new("/src"), "x86", "PREEMPT_RT", &read);
        let config = Config::parse("# CONFIG_EXPERT is not set\nCONFIG_ARCH_SUPPORTS_RT=y\n").unwrap();
        let why = explain(&defs, "PREEMPT_RT", &config).unwrap();
        assert!(
            why.contains("PREEMPT_RT depends on `EXPERT && ARCH_SUPPORTS_RT`"),
            "{why}"
        );
        assert!(why.contains("unmet: EXPERT (is n)"), "{why}");
        assert!(!why.contains("ARCH_SUPPORTS_RT (is"), "{why}");
        let satisfied = Config::parse("CONFIG_EXPERT=y\nCONFIG_ARCH_SUPPORTS_RT=y\n").unwrap();
        assert_eq!(explain(&defs, "PREEMPT_RT", &satisfied), None);
    }

    #[test]
    fn ordering_comparisons() {
        let config = Config::parse(
            "CONFIG_N=3\nCONFIG_BIG=10\nCONFIG_H=0x1000\nCONFIG_NEG=-5\nCONFIG_S=\"abc\"\nCONFIG_A=y\nCONFIG_B=m\n",
        )
        .unwrap();
        let holds = |expr: &str| evaluate(expr, &config).0 == 2;
        // Numbers compare as numbers, not as text ("10" < "3" as strings).
        assert!(holds("BIG > N"));
        assert!(holds("N < BIG"));
        assert!(holds("N < 10"));
        assert!(!holds("BIG < N"));
        assert!(holds("N <= 3") && holds("N >= 3"));
        assert!(!holds("N < 3") && !holds("N > 3"));
        assert!(holds("NEG < 0"));
        // Hex against hex and against decimal.
        assert!(holds("H >= 0x1000") && holds("H > 0xfff") && holds("H = 4096"));
        assert!(!holds("H < 0x100"));
        // Tristates in n < m < y order.
        assert!(holds("B < A") && holds("A > B") && holds("UNSET < B"));
        // Strings by string order.
        assert!(holds("S < \"abd\"") && holds("S >= \"abc\"") && !holds("S > \"b\""));
        let (value, unmet) = evaluate("N > 5", &config);
        assert_eq!(value, 0);
        assert_eq!(unmet, vec!["N>5 (N is 3)".to_string()]);
    }

    #[test]
    fn expressions() {
        let config = Config::parse("CONFIG_A=y\nCONFIG_B=m\nCONFIG_S=\"x\"\nCONFIG_N=3\n").unwrap();
        assert_eq!(evaluate("A && B", &config).0, 1);
        assert_eq!(evaluate("A && !C", &config).0, 2);
        assert_eq!(evaluate("C || (A && B)", &config).0, 1);
        assert_eq!(evaluate("S = \"x\"", &config).0, 2);
        assert_eq!(evaluate("N != 3", &config).0, 0);
        let (value, unmet) = evaluate("A && (C || D) && !A", &config);
        assert_eq!(value, 0);
        assert_eq!(
            unmet,
            vec![
                "C (is n)".to_string(),
                "D (is n)".to_string(),
                "!A (A is set)".to_string()
            ]
        );
        // Garbage never panics.
        for junk in ["A <", "< 3", "N >= ", "0x <= 0x"] {
            let _ = evaluate(junk, &config);
        }
        for junk in ["", "&&", "((", "A =", "\"open", "!!!", ")"] {
            let _ = evaluate(junk, &config);
        }
    }
}
