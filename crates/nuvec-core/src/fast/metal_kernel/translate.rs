//! Metal Shading Language to CUDA: a lexer that keeps every byte's line, checks brackets, and
//! applies the few token rewrites the CUDA prelude (`nuvec_metal_kernel.cuh`) cannot do as
//! declarations. Rewrites replace tokens in place and never add newlines, so NVRTC's line
//! numbers are the user's.

/// A translation failure: what is wrong, and where (1-based line of the body or header).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Failure {
    pub line: usize,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Ident,
    Number,
    Literal,
    Punct,
    Directive,
}

#[derive(Clone, Copy, Debug)]
struct Tok {
    kind: Kind,
    start: usize,
    end: usize,
    line: usize,
}

fn fail<T>(line: usize, message: String) -> Result<T, Failure> {
    Err(Failure { line, message })
}

/// Tokens of `text` (comments and whitespace dropped), or the first lexical error.
fn lex(text: &str) -> Result<Vec<Tok>, Failure> {
    let b = text.as_bytes();
    let (mut i, mut line, mut toks) = (0usize, 1usize, Vec::new());
    let mut line_start = true;
    while i < b.len() {
        let c = b[i];
        let start = i;
        let at = line;
        match c {
            b'\n' => {
                line += 1;
                line_start = true;
                i += 1;
                continue;
            }
            c if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                loop {
                    if i + 1 >= b.len() {
                        return fail(at, "syntax error: a `/*` comment is never closed".into());
                    }
                    if b[i] == b'*' && b[i + 1] == b'/' {
                        i += 2;
                        break;
                    }
                    if b[i] == b'\n' {
                        line += 1;
                    }
                    i += 1;
                }
                continue;
            }
            b'#' if line_start => {
                // A directive runs to the end of the line, through `\` continuations.
                while i < b.len() && b[i] != b'\n' {
                    if b[i] == b'\\' && b.get(i + 1) == Some(&b'\n') {
                        line += 1;
                        i += 1;
                    }
                    i += 1;
                }
                toks.push(Tok { kind: Kind::Directive, start, end: i, line: at });
                continue;
            }
            b'"' | b'\'' => {
                i += 1;
                while i < b.len() && b[i] != c {
                    if b[i] == b'\n' {
                        break;
                    }
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                if i >= b.len() || b[i] != c {
                    return fail(
                        at,
                        format!(
                            "syntax error: a {} literal is never closed",
                            if c == b'"' { "string" } else { "character" }
                        ),
                    );
                }
                i += 1;
                toks.push(Tok { kind: Kind::Literal, start, end: i, line: at });
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                toks.push(Tok { kind: Kind::Ident, start, end: i, line: at });
            }
            c if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(|d| d.is_ascii_digit())) => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.' || b[i] == b'_') {
                    // Exponent signs: 1e-3, 0x1p+4.
                    if (b[i] == b'e' || b[i] == b'E' || b[i] == b'p' || b[i] == b'P')
                        && matches!(b.get(i + 1), Some(b'+') | Some(b'-'))
                    {
                        i += 1;
                    }
                    i += 1;
                }
                toks.push(Tok { kind: Kind::Number, start, end: i, line: at });
            }
            _ => {
                let two = b.get(i..i + 2);
                i += if two == Some(b"::") || two == Some(b"->") { 2 } else { 1 };
                if !c.is_ascii() {
                    return fail(at, "syntax error: a character outside ASCII".into());
                }
                toks.push(Tok { kind: Kind::Punct, start, end: i, line: at });
            }
        }
        line_start = false;
    }
    Ok(toks)
}

/// Brackets must pair up.
fn check_brackets(text: &str, toks: &[Tok]) -> Result<(), Failure> {
    let mut open: Vec<(u8, usize)> = Vec::new();
    for t in toks.iter().filter(|t| t.kind == Kind::Punct) {
        let c = text.as_bytes()[t.start];
        match c {
            b'(' | b'[' | b'{' => open.push((c, t.line)),
            b')' | b']' | b'}' => {
                let want = match c {
                    b')' => b'(',
                    b']' => b'[',
                    _ => b'{',
                };
                match open.pop() {
                    Some((o, _)) if o == want => {}
                    Some((o, l)) => {
                        return fail(
                            t.line,
                            format!(
                                "syntax error: `{}` does not close the `{}` opened at line {l}",
                                c as char, o as char
                            ),
                        );
                    }
                    None => return fail(t.line, format!("syntax error: `{}` closes nothing", c as char)),
                }
            }
            _ => {}
        }
    }
    match open.last() {
        Some(&(o, l)) => fail(l, format!("syntax error: `{}` is never closed", o as char)),
        None => Ok(()),
    }
}

/// Metal vector type names, which `metal::` holds (CUDA predefines its own `float4`...).
fn is_vector_type(s: &str) -> bool {
    const BASES: [&str; 12] =
        ["bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half", "bfloat", "float"];
    let Some(n) = s.as_bytes().last() else { return false };
    matches!(n, b'2' | b'3' | b'4') && BASES.contains(&&s[..s.len() - 1])
}

/// `xy`, `zyx`, `rgba`: the component indices of a swizzle of 2 to 4 letters.
fn swizzle(s: &str) -> Option<Vec<u8>> {
    if !(2..=4).contains(&s.len()) {
        return None;
    }
    let xyzw: Option<Vec<u8>> = s.bytes().map(|c| b"xyzw".iter().position(|&x| x == c).map(|p| p as u8)).collect();
    xyzw.or_else(|| s.bytes().map(|c| b"rgba".iter().position(|&x| x == c).map(|p| p as u8)).collect())
}

/// SIMD-group functions and types the prelude defines.
const SIMD: [&str; 23] = [
    "simd_sum",
    "simd_product",
    "simd_max",
    "simd_min",
    "simd_and",
    "simd_or",
    "simd_xor",
    "simd_shuffle",
    "simd_shuffle_xor",
    "simd_shuffle_down",
    "simd_shuffle_up",
    "simd_broadcast",
    "simd_broadcast_first",
    "simd_prefix_inclusive_sum",
    "simd_prefix_exclusive_sum",
    "simd_prefix_inclusive_product",
    "simd_prefix_exclusive_product",
    "simd_all",
    "simd_any",
    "simd_is_first",
    "simd_ballot",
    "simd_vote",
    "simd_active_threads_mask",
];

/// Constructs with no translation, and why. `next` is the token after `s`: Metal's SIMD- and
/// quad-group functions are refused where they are called, so a variable named `simd_lane` is
/// not taken for one.
fn unsupported(s: &str, next: Option<&str>) -> Option<&'static str> {
    let called = next == Some("(");
    let texture = ["texture1d", "texture2d", "texture3d", "texturecube", "texture2d_array", "texture1d_array"];
    if texture.contains(&s) || s.starts_with("depth2d") || s == "sampler" || s == "access" {
        return Some("Metal textures and samplers have no CUDA translation");
    }
    let matrix = ["simdgroup_float8x8", "simdgroup_half8x8", "simdgroup_bfloat8x8"];
    if s.starts_with("simdgroup_") && s != "simdgroup_barrier" && (called || next == Some("<") || matrix.contains(&s)) {
        return Some("SIMD-group matrices and async copies are not translated");
    }
    if s.starts_with("simd_") && called && !SIMD.contains(&s) {
        return Some("this SIMD-group function is not translated (see the supported table)");
    }
    if s.starts_with("quad_") && called {
        return Some("quad-group functions are not translated");
    }
    if s.strip_prefix("packed_").is_some_and(is_vector_type) {
        return Some("packed vector types are not translated");
    }
    let b = s.as_bytes();
    if b.len() >= 3 && b[b.len() - 2] == b'x' && b[b.len() - 1].is_ascii_digit() && is_vector_type(&s[..s.len() - 2]) {
        return Some("matrix types are not translated");
    }
    match s {
        "kernel" | "vertex" | "fragment" => Some("a kernel takes one body; helpers in the header are plain functions"),
        "imageblock" | "threadgroup_imageblock" | "ray_data" | "object_data" | "visible_function_table" => {
            Some("this address space or resource is not translated")
        }
        _ => None,
    }
}

/// The assignment operator after token `i` (`=`, `+=`, `<<=`, ...), if one follows: the
/// operators are single-character tokens, so a compound one is adjacent characters.
fn assignment_after<'a>(text: &'a str, toks: &[Tok], i: usize) -> Option<&'a str> {
    let punct = |k: usize| toks.get(k).filter(|t| t.kind == Kind::Punct);
    let joined = |k: usize| punct(k + 1).is_some_and(|t| toks[k].end == t.start);
    let first = punct(i + 1)?;
    let (end, len) = match &text[first.start..first.end] {
        "=" if !(joined(i + 1) && &text[toks[i + 2].start..toks[i + 2].end] == "=") => (first.end, 1),
        "+" | "-" | "*" | "/" | "%" | "&" | "|" | "^"
            if joined(i + 1) && &text[toks[i + 2].start..toks[i + 2].end] == "=" =>
        {
            (toks[i + 2].end, 2)
        }
        c @ ("<" | ">")
            if joined(i + 1)
                && &text[toks[i + 2].start..toks[i + 2].end] == c
                && joined(i + 2)
                && &text[toks[i + 3].start..toks[i + 3].end] == "=" =>
        {
            (toks[i + 3].end, 3)
        }
        _ => return None,
    };
    Some(&text[end - len..end])
}

/// A decimal floating literal without a suffix: `0.5`, `1e-30`, `2.` (not `1.0f`, `0x1p4`, `3`).
fn is_unsuffixed_float(n: &str) -> bool {
    let hex = n.starts_with("0x") || n.starts_with("0X");
    let float = n.contains('.') || n.contains(['e', 'E']);
    !hex && float && n.bytes().last().is_some_and(|c| c.is_ascii_digit() || c == b'.')
}

/// `c ? x : 1.0f` with `x` a half or bfloat is a float in Metal, but ambiguous in CUDA C++ (its
/// half types convert to and from float). Where one operand of a conditional is a number, the
/// other is wrapped in `nv_mk_promote`, which widens half types to float and returns the rest.
fn ternary_promotions(text: &str, toks: &[Tok]) -> Vec<(usize, usize, String)> {
    let s = |k: usize| &text[toks[k].start..toks[k].end];
    let punct = |k: usize| if toks[k].kind == Kind::Punct { s(k) } else { "" };
    // The end (exclusive) of the operand starting at `from`: at `stop` tokens outside brackets
    // and conditionals of its own (`:` closing one of those), or where a bracket closes.
    let operand_end = |from: usize, stop: &[&str], to_the_end: bool| -> Option<usize> {
        let (mut depth, mut pending) = (0i32, 0);
        for k in from..toks.len() {
            match punct(k) {
                "(" | "[" | "{" => depth += 1,
                ")" | "]" | "}" if depth == 0 => return Some(k),
                ")" | "]" | "}" => depth -= 1,
                "?" if depth == 0 => pending += 1,
                ":" if depth == 0 && pending > 0 => pending -= 1,
                p if depth == 0 && !p.is_empty() && stop.contains(&p) => return Some(k),
                _ => {}
            }
        }
        Some(toks.len()).filter(|_| to_the_end)
    };
    let number = |a: usize, b: usize| match b - a {
        1 => toks[a].kind == Kind::Number,
        2 => matches!(punct(a), "-" | "+") && toks[a + 1].kind == Kind::Number,
        _ => false,
    };
    let mut edits = Vec::new();
    for q in (0..toks.len()).filter(|&k| punct(k) == "?") {
        // A bracket closing before any `:` leaves no conditional to rewrite.
        let Some(colon) = operand_end(q + 1, &[":"], false).filter(|&c| punct(c) == ":") else { continue };
        let Some(end) = operand_end(colon + 1, &[",", ";", ":"], true) else { continue };
        let (then, other) = ((q + 1, colon), (colon + 1, end));
        let wrap = match (number(then.0, then.1), number(other.0, other.1)) {
            (false, true) => then,
            (true, false) => other,
            _ => continue,
        };
        if wrap.0 < wrap.1 {
            edits.push((toks[wrap.0].start, toks[wrap.0].start, "nv_mk_promote(".to_string()));
            edits.push((toks[wrap.1 - 1].end, toks[wrap.1 - 1].end, ")".to_string()));
        }
    }
    edits
}

/// Standard attributes CUDA C++ accepts as they are.
const ATTRIBUTES: [&str; 5] = ["maybe_unused", "likely", "unlikely", "fallthrough", "nodiscard"];

/// Translates one Metal text (the body or the header) to CUDA C++ with the same lines.
pub(crate) fn translate(text: &str) -> Result<String, Failure> {
    let toks = lex(text)?;
    check_brackets(text, &toks)?;
    let s = |t: &Tok| &text[t.start..t.end];
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| s(&toks[j]));
        let next = toks.get(i + 1).map(s);
        match t.kind {
            Kind::Directive => {
                let d: String = s(t).split_whitespace().collect::<Vec<_>>().join(" ");
                if d.starts_with("#include <metal_") || d.starts_with("#include \"metal_") {
                    // The prelude stands for Metal's standard headers.
                    edits.push((t.start, t.end, format!("// {}", s(t))));
                }
                continue;
            }
            Kind::Number if is_unsuffixed_float(s(t)) => {
                // Metal has no double: `0.5` is a float there, and stays one on CUDA.
                edits.push((t.end, t.end, "f".into()));
                continue;
            }
            Kind::Punct if s(t) == "[" && next == Some("[") => {
                let name = toks.get(i + 2).map(s).unwrap_or("");
                if !ATTRIBUTES.contains(&name) {
                    return fail(
                        t.line,
                        format!("unsupported construct `[[{name}]]`: Metal attributes are not translated"),
                    );
                }
                continue;
            }
            Kind::Ident => {}
            _ => continue,
        }
        let word = s(t);
        if matches!(prev, Some(".") | Some("->")) {
            if let Some(idx) = swizzle(word) {
                let list: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
                // An assigned swizzle is a reference to its components, which must differ.
                let write = assignment_after(text, &toks, i);
                if let Some(op) = write
                    && idx.iter().enumerate().any(|(k, c)| idx[..k].contains(c))
                {
                    return fail(
                        t.line,
                        format!(
                            "unsupported construct `.{word} {op}`: a swizzle with a repeated component cannot be \
                             assigned to"
                        ),
                    );
                }
                let method = if write.is_some() { "wsw" } else { "sw" };
                edits.push((t.start, t.end, format!("template {method}<{}>()", list.join(", "))));
            }
            continue;
        }
        if let Some(why) = unsupported(word, next) {
            return fail(t.line, format!("unsupported construct `{word}`: {why}"));
        }
        if prev == Some("::") {
            continue;
        }
        match word {
            // Address spaces: CUDA pointers are generic.
            "device" | "constant" | "thread" => edits.push((t.start, t.end, String::new())),
            "threadgroup" => {
                let statement_start =
                    prev.is_none_or(|p| matches!(p, ";" | "{" | "}")) || i > 0 && toks[i - 1].kind == Kind::Directive;
                let pointer = toks[i + 1..]
                    .iter()
                    .map(s)
                    .take_while(|w| !matches!(*w, ";" | "=" | "[" | "(" | ")" | ","))
                    .any(|w| w == "*" || w == "&");
                let with = if statement_start && !pointer { "__shared__" } else { "" };
                edits.push((t.start, t.end, with.to_string()));
            }
            w if is_vector_type(w) => edits.push((t.start, t.end, format!("metal::{w}"))),
            "vec" if next == Some("<") => edits.push((t.start, t.end, "metal::vec".into())),
            "numeric_limits" if next == Some("<") => edits.push((t.start, t.end, "metal::numeric_limits".into())),
            _ => {}
        }
    }
    edits.extend(ternary_promotions(text, &toks));
    // Insertions go before a replacement starting at the same place, after one ending there.
    edits.sort_by_key(|&(a, b, _)| (a, b));
    let mut out = String::with_capacity(text.len() + 64);
    let mut at = 0;
    for (a, b, with) in edits {
        out.push_str(&text[at..a]);
        out.push_str(&with);
        at = b;
    }
    out.push_str(&text[at..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_keep_lines() {
        let src = "threadgroup float buf[32];\nconst device float4* p = (const device float4*)x;\nfloat2 v = p[0].xy;\nthreadgroup_barrier(mem_flags::mem_threadgroup);";
        let out = translate(src).unwrap();
        assert_eq!(out.lines().count(), src.lines().count());
        assert!(out.starts_with("__shared__ float buf[32];"), "{out}");
        assert!(out.contains("const  metal::float4* p = (const  metal::float4*)x;"), "{out}");
        assert!(out.contains("metal::float2 v = p[0].template sw<0, 1>();"), "{out}");
        assert!(out.contains("threadgroup_barrier(mem_flags::mem_threadgroup);"), "{out}");
    }

    #[test]
    fn assigned_swizzles_become_references() {
        let src = "v.xy = w.zw;\nv.zw += 1.0f;\np->rgb *= 2;\nk.yx <<= 1;\nb = v.xy == w.xy;\nc = v.xy <= w.xy;";
        let out = translate(src).unwrap();
        let want = [
            "v.template wsw<0, 1>() = w.template sw<2, 3>();",
            "v.template wsw<2, 3>() += 1.0f;",
            "p->template wsw<0, 1, 2>() *= 2;",
            "k.template wsw<1, 0>() <<= 1;",
            "b = v.template sw<0, 1>() == w.template sw<0, 1>();",
            "c = v.template sw<0, 1>() <= w.template sw<0, 1>();",
        ];
        assert_eq!(out.lines().collect::<Vec<_>>(), want, "{out}");
        // Reads may repeat components; writes may not.
        assert!(translate("float2 a = v.xx;").unwrap().contains("sw<0, 0>()"));
        let e = translate("float a;\nv.xx = float2(1.0f, 2.0f);").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("`.xx =`") && e.message.contains("repeated component"), "{e:?}");
        let e = translate("v.rgr += 1.0f;").unwrap_err();
        assert!(e.message.contains("`.rgr +=`"), "{e:?}");
    }

    #[test]
    fn floating_literals_are_float() {
        let out = translate("float a = 0.5 * x + 1e-30 - 2. + .25e+2;\nint b = 3 + 0x1f;\nhalf c = 1.0f;").unwrap();
        assert_eq!(out, "float a = 0.5f * x + 1e-30f - 2.f + .25e+2f;\nint b = 3 + 0x1f;\nhalf c = 1.0f;");
    }

    #[test]
    fn conditionals_with_a_number_promote_the_other_operand() {
        let src = "float a = i < V ? x[i] : -1e30;\nb = c ? 0 : f(y, z ? 1 : w);\nd = (c ? p : q) + (c ? 2 : 3);";
        let out = translate(src).unwrap();
        let want = [
            "float a = i < V ? nv_mk_promote(x[i]) : -1e30f;",
            "b = c ? 0 : nv_mk_promote(f(y, z ? 1 : nv_mk_promote(w)));",
            "d = (c ? p : q) + (c ? 2 : 3);",
        ];
        assert_eq!(out.lines().collect::<Vec<_>>(), want, "{out}");
    }

    #[test]
    fn metal_prefixes_are_refused_only_for_metal_names() {
        // Variables and inputs may be named like Metal's functions and types.
        let src = "uint simd_lane_id = 0;\nuint8_t w = packed_weights[simd_lane_id];\nfloat quad_sum = 1.0f;";
        assert!(translate(src).is_ok());
        for bad in
            ["x = quad_shuffle(x, 1);", "packed_half4 p;", "simdgroup_load(m, p);", "simdgroup_matrix<float, 8, 8> m;"]
        {
            assert!(translate(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn threadgroup_pointers_lose_the_qualifier() {
        let out = translate("threadgroup float* p = buf;\nvoid f(threadgroup float* q);").unwrap();
        assert!(out.starts_with(" float* p = buf;"), "{out}");
        assert!(out.contains("void f( float* q);"), "{out}");
    }

    #[test]
    fn errors_name_construct_and_line() {
        let e = translate("float a = 1;\n\ntexture2d<float> t;").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("`texture2d`"), "{e:?}");
        let e = translate("uint b = simd_shuffle_rotate_down(x, 1);").unwrap_err();
        assert!(e.message.contains("`simd_shuffle_rotate_down`"), "{e:?}");
        let e = translate("if (x) {\n  y = 1;\n").unwrap_err();
        assert_eq!((e.line, e.message.contains("`{` is never closed")), (1, true), "{e:?}");
        let e = translate("a = (b + c];").unwrap_err();
        assert!(e.message.contains("`]` does not close the `(`"), "{e:?}");
        let e = translate("x = 1;\n/* open").unwrap_err();
        assert_eq!(e.line, 2);
        let e = translate("[[buffer(0)]] float x;").unwrap_err();
        assert!(e.message.contains("`[[buffer]]`"), "{e:?}");
        assert!(translate("[[maybe_unused]] float x = 0.5e-3f;").is_ok());
    }
}
