//! Bounds on a CEL expression checked before it is parsed, so that no rule, message expression
//! or match condition can build a syntax tree deep enough to overflow the stack of the thread
//! that parses, checks, evaluates or drops it.
//!
//! cel-go (kube-apiserver's CEL) refuses an expression of more than 100,000 code points, and its
//! parser counts every step of a left-recursive chain (`1 + 1 + …`, `a == b == …`, `a.b.c…`,
//! `x[0][0]…`) against its recursion limit of 250. The `cel` crate's parser bounds nesting
//! (parentheses, calls, literals, conditionals) only once its recursive descent is that deep,
//! and not those chains, which it turns into a tree as deep as the chain is long: a few thousand
//! terms overflow a thread's stack. So this counts, per nesting level, the operators of one chain
//! (arithmetic, comparison, `in`, `!`, member and index steps), which `&&`, `||`, `?`, `:` and
//! `,` end (`&&` and `||` chains are balanced into shallow trees by both parsers), and refuses a
//! chain longer than cel-go's limit with cel-go's message; and it bounds the nesting of brackets
//! and conditionals at [`MAX_NESTING`], lower than cel-go's. The chain count is an upper bound of
//! the chain's depth (a unary `-` or a float's `.` counts too), so an expression cel-go accepts
//! may rarely be refused here, never the reverse.

/// cel-go's default `ExpressionSizeCodePointLimit`.
pub(super) const MAX_CODE_POINTS: usize = 100_000;

/// cel-go's default parser recursion limit, applied to one chain of left-recursive operators.
pub(super) const MAX_CHAIN: usize = 250;

/// The deepest nesting of brackets and conditionals (`?`) allowed. The `cel` crate's parser
/// refuses nesting beyond 96, but only after its recursive descent has gone that deep, which
/// in an unoptimized build takes more than 512 KiB of stack from about 64 levels; 32 leaves the
/// margin the crate's other depth bounds keep (`limits.rs`). cel-go allows 250: a rule nesting
/// deeper than 32 is refused here and accepted by kube-apiserver.
pub(super) const MAX_NESTING: usize = 32;

/// `Err` with cel-go's message when `source` is longer than [`MAX_CODE_POINTS`], holds a
/// chain of more than [`MAX_CHAIN`] operators or nests deeper than [`MAX_NESTING`].
pub(super) fn check(source: &str) -> Result<(), String> {
    let chars: Vec<char> = source.chars().collect();
    if chars.len() > MAX_CODE_POINTS {
        return Err(format!(
            "expression code point size exceeds limit: size: {}, limit {MAX_CODE_POINTS}",
            chars.len()
        ));
    }
    // The length of the current chain at each open bracket, innermost last.
    let mut chains: Vec<usize> = vec![0];
    // The conditionals (`?`) open at each bracket level, innermost last.
    let mut conditionals: Vec<usize> = vec![0];
    let nest = |chains: &Vec<usize>, conditionals: &Vec<usize>| -> Result<(), String> {
        if chains.len() - 1 + conditionals.iter().sum::<usize>() > MAX_NESTING {
            return Err(format!("expression recursion limit exceeded: {MAX_NESTING}"));
        }
        Ok(())
    };
    let bump = |chains: &mut Vec<usize>| -> Result<(), String> {
        if let Some(n) = chains.last_mut() {
            *n += 1;
            if *n > MAX_CHAIN {
                return Err(format!("expression recursion limit exceeded: {MAX_CHAIN}"));
            }
        }
        Ok(())
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' => {
                i = after_string(&chars, i);
                continue;
            }
            '[' | '(' | '{' => {
                if c == '[' {
                    bump(&mut chains)?;
                }
                chains.push(0);
                conditionals.push(0);
                nest(&chains, &conditionals)?;
            }
            ')' | ']' | '}' if chains.len() > 1 => {
                chains.pop();
                conditionals.pop();
            }
            '?' => {
                if let (Some(n), Some(q)) = (chains.last_mut(), conditionals.last_mut()) {
                    *n = 0;
                    *q += 1;
                }
                nest(&chains, &conditionals)?;
            }
            '&' | '|' | ':' | ',' => {
                if let Some(n) = chains.last_mut() {
                    *n = 0;
                }
            }
            '+' | '-' | '*' | '/' | '%' | '<' | '>' | '!' | '.' => bump(&mut chains)?,
            '=' if chars.get(i + 1) == Some(&'=') => {
                bump(&mut chains)?;
                i += 1;
            }
            c if c.is_alphanumeric() || c == '_' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                if chars[start..i] == ['i', 'n'] {
                    bump(&mut chains)?;
                }
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The index just past the string literal opening at `open` (a quote; triple quotes too,
/// backslash escapes skipped), or the end of `chars` if it is not closed.
fn after_string(chars: &[char], open: usize) -> usize {
    let quote = chars[open];
    let triple = chars.get(open + 1) == Some(&quote) && chars.get(open + 2) == Some(&quote);
    let mut i = open + if triple { 3 } else { 1 };
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            c if c == quote && !triple => return i + 1,
            c if c == quote && chars.get(i + 1) == Some(&quote) && chars.get(i + 2) == Some(&quote) => return i + 3,
            _ => i += 1,
        }
    }
    chars.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_are_counted_per_level_and_ended_by_logical_operators() {
        let chain = |n: usize, op: &str| vec!["1"; n].join(op);
        assert!(check(&chain(MAX_CHAIN + 1, "+")).is_ok(), "n terms are n-1 operators");
        assert_eq!(
            check(&chain(MAX_CHAIN + 2, "+")).unwrap_err(),
            "expression recursion limit exceeded: 250"
        );
        assert!(check(&chain(MAX_CHAIN + 2, " == 1 && ")).is_ok());
        assert!(check(&format!("({}) + ({})", chain(200, "+"), chain(200, "+"))).is_ok());
        assert!(check(&format!("'{}' + 1", "+".repeat(1000))).is_ok(), "inside a string");
        assert!(check(&format!("self{}", ".a".repeat(MAX_CHAIN + 1))).is_err());
        assert_eq!(
            check(&"1".repeat(MAX_CODE_POINTS + 1)).unwrap_err(),
            "expression code point size exceeds limit: size: 100001, limit 100000"
        );
    }

    /// The longest chains and the largest expression allowed compile, are checked against a
    /// schema, evaluate and drop on a quarter of a tokio worker's stack (unoptimized): nothing
    /// under the limits can overflow it.
    #[test]
    fn expressions_at_the_limits_fit_a_quarter_of_a_worker_stack() {
        use serde_json::json;
        let run = || {
            // `.`, `==` and 248 `+`: a chain of 250 as counted here, worth 249.
            let terms = vec!["1"; MAX_CHAIN - 1].join("+");
            let bangs = "!".repeat(MAX_CHAIN - 2);
            let wide = vec!["self.a == 249"; MAX_CODE_POINTS / 17].join(" && ");
            assert!(wide.chars().count() <= MAX_CODE_POINTS);
            for rule in [format!("self.a == {terms}"), format!("{bangs}(self.a == 249)"), wide] {
                let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
                    "x-kubernetes-validations": [{"rule": rule}]});
                let errs = crate::cel::check_schema(&schema, "s");
                assert!(errs.is_empty(), "{}: {errs:?}", &rule[..40]);
                assert!(crate::cel::validate(&schema, &json!({"a": 249}), None).is_empty());
                assert_eq!(crate::cel::validate(&schema, &json!({"a": 1}), None).len(), 1);
            }
            // The deepest nesting allowed, then deeper (refused before parsing).
            for n in [MAX_NESTING, 20_000] {
                for deep in [
                    format!("{}true{}", "(".repeat(n), ")".repeat(n)),
                    format!("{}true", "false ? false : ".repeat(n)),
                    format!("size({}1{}) == 1", "[".repeat(n - 1), "]".repeat(n - 1)),
                ] {
                    let schema = json!({"x-kubernetes-validations": [{"rule": deep}]});
                    let errs = crate::cel::check_schema(&schema, "s");
                    assert_eq!(errs.is_empty(), n == MAX_NESTING, "{}: {errs:?}", &deep[..30]);
                    if n == MAX_NESTING {
                        assert!(crate::cel::validate(&schema, &json!({}), None).is_empty());
                    }
                }
            }
            let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
                "x-kubernetes-validations": [{"rule": format!("self.a == 1+{terms}")}]});
            let errs = crate::cel::check_schema(&schema, "s");
            assert!(
                errs[0].detail.contains("expression recursion limit exceeded: 250"),
                "{errs:?}"
            );
        };
        std::thread::Builder::new()
            .stack_size(512 * 1024)
            .spawn(run)
            .unwrap()
            .join()
            .unwrap();
    }
}
