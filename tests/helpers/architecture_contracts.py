"""A custom import-linter contract type: TF/Keras private modules imported only by `_compat`.

import-linter's own `forbidden` contracts can name only the root of an external package
(`tensorflow`), and objckpt imports `tensorflow` everywhere; what only `objckpt._compat` may
import is TF's and Keras's private modules (`tensorflow.python`, `keras.src`, `tf_keras.src`).
This contract reads the graph's import details (each import's line as written) to find them.

Declared in pyproject.toml (`[tool.importlinter]`: `contract_types`); `lint-imports` runs from
the repository root, which puts the root on the path (`tests.helpers.architecture_contracts`).
"""

from __future__ import annotations

import re

from importlinter import Contract, ContractCheck, fields, output


class PrivateExternalsContract(Contract):
    """Modules of `source_modules` (packages, with their descendants), except those of
    `allowed_modules`, import no module under the dotted `private_modules`.

    Options:
        - source_modules: the packages checked (e.g. `objckpt`).
        - allowed_modules: the packages that may (e.g. `objckpt._compat`).
        - private_modules: dotted external modules (e.g. `tensorflow.python`, `keras.src`).
    """

    type_name = "private_externals"

    source_modules = fields.SetField(subfield=fields.StringField())
    allowed_modules = fields.SetField(subfield=fields.StringField(), required=False)
    private_modules = fields.SetField(subfield=fields.StringField())

    def _patterns(self):
        """dotted name -> regex matching an import line that reaches it: `import a.b...`,
        `from a.b... import x`, `from a import b`."""
        patterns = {}
        for dotted in sorted(self.private_modules):
            root, _, rest = dotted.rpartition(".")
            patterns[dotted] = re.compile(
                rf"^\s*(import\s+{re.escape(dotted)}\b|from\s+{re.escape(dotted)}\b"
                rf"|from\s+{re.escape(root)}\s+import\s+(\(\s*)?([\w\s,]*,\s*)?{re.escape(rest)}\b)")
        return patterns

    def check(self, graph, verbose: bool) -> ContractCheck:
        def within(module, packages):
            return any(module == p or module.startswith(p + ".") for p in packages)

        allowed = set(self.allowed_modules or ())
        patterns = self._patterns()
        roots = {dotted.split(".")[0] for dotted in patterns} & set(graph.modules)
        found = []
        for module in sorted(graph.modules):
            if not within(module, self.source_modules) or within(module, allowed):
                continue
            for root in sorted(roots):
                for detail in graph.get_import_details(importer=module, imported=root):
                    line = detail["line_contents"]
                    for dotted, pattern in patterns.items():
                        if pattern.search(line):
                            found.append((module, dotted, detail["line_number"], line))
        return ContractCheck(kept=not found, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        allowed = ", ".join(sorted(self.allowed_modules or ())) or "no module"
        output.print_error(f"Only {allowed} may import these private modules:", bold=False)
        output.new_line()
        for module, dotted, line_number, line in check.metadata["found"]:
            output.print_error(f"- {module} -> {dotted} (l.{line_number}: {line.strip()})",
                               bold=False)
            output.new_line()
        output.print_error(
            "Fix: move the code that needs the private module into objckpt/_compat/ and call "
            "it from there.", bold=False)
