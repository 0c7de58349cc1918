"""Judged means provoked: which changed expressions the gate evaluates beside the base's, and its verdict.

A changed line that ran under a property is judged by the rule that applies to it:

- **provoked**: a changed condition or side-effect-free expression, found by
  matching the base's and the head's functions statement by statement (a
  deleted operand or guard is a changed condition), is judged only when some
  example made it give something other than the base's expression gave, in the
  same frame on the same values (``core.provoke`` evaluates both). Ran, but equal
  to the base on every example: could not check (exit 3), naming the expression
  and what would provoke it where that is known. A rewrite that keeps the
  condition exactly (``not (a is b)`` for ``a is not b``, De Morgan in a test,
  layout) is no change. Any other rewrite, even one that is equal in fact (``a and
  b`` for ``b and a``, ``not x > y`` for ``x <= y``, which differ on NaN and on
  tensors), is not provable from examples that never told them apart: exit 3
  too, never a finding;
- **reached**: where the base's expression cannot be evaluated safely (a call with
  effects, a store), or is no expression (a new statement, a changed target), the
  line is judged as before: it ran, and a property compared its outputs.

Only the changed functions of the changed files are probed, so the rest of the run
pays nothing for it.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

#: Builtins and method names a base expression may call and still be evaluated twice safely.
PURE_CALLS = frozenset({
    "all", "any", "len", "isinstance", "issubclass", "min", "max", "abs", "bool", "int", "float", "str",
    "tuple", "sum", "getattr", "hasattr", "callable", "type", "sorted", "frozenset", "round", "divmod",
    "numel", "size", "dim", "item", "get", "keys", "values", "items", "startswith", "endswith",
    "is_contiguous", "element_size", "nelement", "count", "cdiv", "ceil_div"})
PREDICATE_PREFIXES = ("is_", "has_", "can_", "use_", "supports_")

_TESTS = (ast.If, ast.While, ast.Assert)


@dataclass
class Probe:
    ident: str
    function: str  # the head's qualified name of the function it is in
    patch: str  # the function given new code: the outermost one reachable from the module
    lines: list[int]  # the head statements' first lines this probe judges
    kind: str  # "test" (truth), "value" (equality) or "guard" (a deleted guard's test against True)
    head: str
    base: str
    at: dict  # where the head's expression (or, for a guard, statement) sits
    unsafe: str = ""  # why the base's expression is not evaluated (the older rule applies)

    def as_plan(self, file: str, module: str) -> dict:
        return {"id": self.ident, "file": file, "module": module, "patch": self.patch, "kind": self.kind,
                "base": self.base, "at": self.at, "head": not self.head.startswith("False")}


def unsafe(expr: ast.AST) -> str:
    """Why evaluating ``expr`` a second time could change what the code does ('' when it cannot)."""
    for n in ast.walk(expr):
        if isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            return f"it holds {type(n).__name__}, which stores or suspends"
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name is None or not (name in PURE_CALLS or name.startswith(PREDICATE_PREFIXES)):
                return f"it calls {ast.unparse(f)}(), which may have effects"
    return ""


def _canon(node: ast.AST) -> str:
    """A spelling equal for two conditions only when they are the same test exactly, in any context."""
    class Fold(ast.NodeTransformer):
        def visit_UnaryOp(self, n):
            self.generic_visit(n)
            if isinstance(n.op, ast.Not) and isinstance(n.operand, ast.Compare) and len(n.operand.ops) == 1:
                flip = {ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
                op = type(n.operand.ops[0])
                if op in flip:
                    return ast.Compare(n.operand.left, [flip[op]()], n.operand.comparators)
            return n
    return ast.dump(Fold().visit(ast.parse(ast.unparse(node), mode="eval")), annotate_fields=False)


def _test_canon(node: ast.AST) -> str:
    """As ``_canon``, for a truth test: De Morgan and double negation keep a test's every outcome too."""
    def fold(n):
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not):
            inner = n.operand
            if isinstance(inner, ast.UnaryOp) and isinstance(inner.op, ast.Not):
                return fold(inner.operand)
            if isinstance(inner, ast.BoolOp):
                other = ast.Or() if isinstance(inner.op, ast.And) else ast.And()
                return ast.BoolOp(other, [fold(ast.UnaryOp(ast.Not(), v)) for v in inner.values])
        if isinstance(n, ast.BoolOp):
            return ast.BoolOp(n.op, [fold(v) for v in n.values])
        return n
    return _canon(fold(ast.parse(ast.unparse(node), mode="eval").body))


def _header(stmt: ast.stmt) -> str:
    """A statement's own text, its body left out: what lines it up with its other side."""
    if isinstance(stmt, (ast.If, ast.While)):
        return f"{type(stmt).__name__} {ast.unparse(stmt.test)}"
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return f"for {ast.unparse(stmt.target)} in {ast.unparse(stmt.iter)}"
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return "with " + ", ".join(ast.unparse(i) for i in stmt.items)
    if isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try), ast.Match)):
        return type(stmt).__name__
    return ast.unparse(stmt)


def _flat(body: list[ast.stmt]) -> list[ast.stmt]:
    """A function's statements in source order, nested blocks included, nested functions and classes not."""
    out = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        out.append(stmt)
        for field in ("body", "orelse", "finalbody"):
            out += _flat(getattr(stmt, field, None) or [])
        for h in getattr(stmt, "handlers", None) or []:
            out += _flat(h.body)
        for c in getattr(stmt, "cases", None) or []:
            out += _flat(c.body)
    return out


def functions(tree: ast.Module) -> dict[str, tuple[ast.AST, str]]:
    """qualified name -> (the def, the name of the outermost function a module attribute reaches)."""
    out = {}

    def walk(body, scope, patch, in_function):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qual = f"{scope}.{node.name}" if scope else node.name
                reach = patch if in_function else qual
                out[qual] = (node, reach)
                walk(node.body, qual, reach, True)
            elif isinstance(node, ast.ClassDef):
                qual = f"{scope}.{node.name}" if scope else node.name
                walk(node.body, qual, patch, in_function)
    walk(tree.body, "", "", False)
    return out


def _pairs(b, h, stack):
    """Where two same-shaped statements differ: (base node, head node, their ancestors) per difference."""
    if type(b) is not type(h):
        return [(b, h, stack)]
    if not isinstance(b, ast.AST):
        return [] if b == h else [(b, h, stack)]
    out = []
    for field in b._fields:
        if field in ("ctx", "body", "orelse", "finalbody", "handlers", "cases", "type_comment"):
            continue
        bv, hv = getattr(b, field, None), getattr(h, field, None)
        if isinstance(bv, list) and isinstance(hv, list):
            if len(bv) != len(hv):
                return [(b, h, stack)]
            subs = [p for x, y in zip(bv, hv) for p in _pairs(x, y, stack + [(b, h)])]
        elif isinstance(bv, ast.AST) and isinstance(hv, ast.AST):
            subs = _pairs(bv, hv, stack + [(b, h)])
        elif bv != hv:
            return [(b, h, stack)]
        else:
            continue
        if any(not isinstance(x, ast.expr) for x, _, _ in subs):  # an operator, a keyword's name: this node
            return [(b, h, stack)]
        out += subs
    return out


def _standalone(b, h, stack):
    """The pair climbed to the smallest expressions that can be evaluated on their own in the frame."""
    scoped = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.Lambda)
    for i, (pb, ph) in enumerate(stack):
        if isinstance(ph, scoped):  # its variables are not the frame's: the whole comprehension
            b, h, stack = pb, ph, stack[:i]
            break
    while stack:
        pb, ph = stack[-1]
        loose = (not isinstance(h, ast.expr) or isinstance(getattr(h, "ctx", None), (ast.Store, ast.Del))
                 or isinstance(h, (ast.Starred, ast.Slice))
                 or (isinstance(ph, ast.Call) and ph.func is h))
        if not loose:
            return b, h, stack
        b, h, stack = pb, ph, stack[:-1]
    return (b, h, stack) if isinstance(h, ast.expr) else None


def _where(node) -> dict:
    return {"type": type(node).__name__, "line": node.lineno, "col": node.col_offset,
            "end_line": node.end_lineno, "end_col": node.end_col_offset}


def plan(base_text: str, head_text: str, changed: frozenset[int], prefix: str = "p") -> list[Probe]:
    """The probes for one file: every changed expression of a function the base also has."""
    try:
        base_fns, head_fns = functions(ast.parse(base_text)), functions(ast.parse(head_text))
    except SyntaxError:
        return []
    out: list[Probe] = []
    for qual, (hdef, patch) in head_fns.items():
        if qual not in base_fns or not any(hdef.lineno <= n <= hdef.end_lineno for n in changed):
            continue
        if any("jit" in ast.unparse(d) for d in hdef.decorator_list):
            continue  # a kernel: Triton compiles its own source, never this process's code
        out += _function_probes(base_fns[qual][0], hdef, qual, patch, changed, f"{prefix}{len(out)}")
    for i, p in enumerate(out):
        p.ident = f"{prefix}.{i}"
    return out


def _touches(stmt: ast.stmt, changed) -> bool:
    last = stmt.end_lineno if not hasattr(stmt, "body") else max(stmt.lineno, stmt.body[0].lineno - 1)
    if isinstance(stmt, (ast.If, ast.While)):
        last = stmt.test.end_lineno
    return any(stmt.lineno <= n <= last for n in changed)


def _function_probes(bdef, hdef, qual, patch, changed, ident) -> list[Probe]:
    base, head = _flat(bdef.body), _flat(hdef.body)
    match = difflib.SequenceMatcher(None, [_header(s) for s in base], [_header(s) for s in head], autojunk=False)
    same: dict[int, int] = {}  # base statement -> head statement with the same text
    out: list[Probe] = []
    loose_base, loose_head = [], []
    for op, i1, i2, j1, j2 in match.get_opcodes():
        if op == "equal":
            same.update({i1 + k: j1 + k for k in range(i2 - i1)})
            continue
        for k in range(max(i2 - i1, j2 - j1)):
            bs = base[i1 + k] if i1 + k < i2 else None
            hs = head[j1 + k] if j1 + k < j2 else None
            if bs is not None and hs is not None and type(bs) is type(hs):
                if _touches(hs, changed):
                    out += _statement_probes(bs, hs, qual, patch, ident)
                continue
            if bs is not None:
                loose_base.append(bs)
            if hs is not None:
                loose_head.append(hs)
    index = {id(s): n for n, s in enumerate(base)}
    for bs in loose_base:
        if not isinstance(bs, ast.If) or bs.orelse:
            continue
        kept = [head[same[index[id(s)]]] for s in bs.body if index.get(id(s)) in same]
        if kept:  # a deleted guard: its body now runs in the head unguarded
            if any(_touches(s, changed) for s in kept):
                out.append(_probe(qual, patch, [s.lineno for s in kept], "guard", ast.Constant(True), bs.test,
                                  _where(kept[0]), head_text="True (its guard deleted)"))
            continue
        # deleted with its body: the head never runs what the base ran when the test held
        after = [same[n] for n in range(index[id(bs)] + 1, len(base)) if n in same and base[n].lineno > bs.end_lineno]
        before = [same[n] for n in range(index[id(bs)]) if n in same]
        if not after:
            continue
        anchor = head[after[0]]
        near = [head[before[-1]]] if before else []
        if any(lo <= n <= anchor.end_lineno for n in changed for lo in [(near or [anchor])[0].lineno]):
            out.append(_probe(qual, patch, [s.lineno for s in near + [anchor]], "guard", ast.Constant(False),
                              bs.test, _where(anchor), head_text="False (the block it guarded deleted)"))
    hindex = {id(s): n for n, s in enumerate(head)}
    kept_head = set(same.values())
    for hs in loose_head:  # an added guard: the base ran its body unguarded
        if isinstance(hs, ast.If) and not hs.orelse and _touches(hs, changed) \
                and any(hindex.get(id(s)) in kept_head for s in hs.body):
            out.append(_probe(qual, patch, [hs.lineno], "test", hs.test, ast.Constant(True), _where(hs.test)))
    return out


def _joined(found: list) -> list:
    """Several differences under one side-effect-free expression (operands swapped) are that expression's."""
    if len(found) < 2:
        return found
    common = 0
    while all(len(s) > common and s[common][1] is found[0][2][common][1] for _, _, s in found):
        common += 1
    stack = found[0][2][:common]
    if not stack or not isinstance(stack[-1][1], ast.expr) or unsafe(stack[-1][0]):
        return found
    return [_standalone(*stack[-1], stack[:-1])]


def _whole_test(h, stack):
    """The whole test a changed part of it sits in, as (base's, head's, their ancestors), or None.

    A condition's operand is used only through the test's truth: ``topk < 1`` for ``topk == 1`` after a
    short-circuiting ``is_cuda and`` differs from the base's operand whenever it runs, yet the branch
    goes the same way unless every operand before and after it lets the difference through. So a part
    of a test is provoked only when the whole test came out otherwise, where that test can be
    evaluated twice safely; else the part is probed alone, as before."""
    for i, (pb, ph) in enumerate(stack):
        inner = stack[i + 1][1] if i + 1 < len(stack) else h
        if isinstance(ph, _TESTS + (ast.IfExp,)) and ph.test is inner and inner is not h:
            if not unsafe(pb.test):
                return pb.test, ph.test, stack[:i + 1]
    return None


def _statement_probes(bs, hs, qual, patch, ident) -> list[Probe]:
    out = []
    found = [c for c in (_standalone(b, h, s) for b, h, s in _pairs(bs, hs, [])) if c is not None]
    for b, h, stack in _joined(found):
        b, h, stack = _whole_test(h, stack) or (b, h, stack)
        parent = stack[-1][1] if stack else hs
        test = (isinstance(parent, _TESTS + (ast.IfExp,)) and parent.test is h) \
            or (isinstance(parent, ast.comprehension) and h in parent.ifs)
        if test and _test_canon(b) == _test_canon(h) or _canon(b) == _canon(h):
            continue  # the same test exactly, spelled otherwise
        out.append(_probe(qual, patch, [hs.lineno], "test" if test else "value", h, b, _where(h)))
    return out


def _probe(qual, patch, lines, kind, head, base, at, head_text=None) -> Probe:
    return Probe("", qual, patch, lines, kind, head_text or ast.unparse(head), ast.unparse(base), at, unsafe(base))




def plan_files(files: dict, lines: dict, checkout) -> dict[str, list[Probe]]:
    """Listed path -> its probes, for each traced file with a diff against a base the checkout holds."""
    from vmfuzz.harness.engine.campaign.changes import ChangeError, _git, sglang_relative
    out = {}
    for n, (path, real) in enumerate(sorted(files.items())):
        changed = lines.get(path)
        if not changed or checkout is None or not getattr(checkout, "base", None):
            continue
        try:
            base_text = _git(checkout.root, "show", f"{checkout.base}:{path}")
            head_text = real.read_text(encoding="utf-8")
        except (ChangeError, OSError, UnicodeDecodeError):
            continue  # a new file has no base expression: its lines are judged as reached
        out[path] = plan(base_text, head_text, changed, prefix=f"f{n}")
    return out


def module_name(path: str) -> str:
    from vmfuzz.harness.engine.campaign.changes import sglang_relative
    rel = (sglang_relative(path) or path).removesuffix(".py").replace("/", ".")
    return "sglang." + rel.removesuffix(".__init__")
