"""A mixed-integer linear program in a backend-neutral form (what the backends in solvers/backends/ solve).

Time variables carry integer coefficients and constants are in the program's time unit, so a backend that
needs integers (CP-SAT) only has to scale constants.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from formulation.placement import Placement
from formulation.space import Config

INF = float("inf")


@dataclass
class Program:
    """A mixed-integer linear program in a backend-neutral form; minimise objective / objective_divisor."""

    names: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # "binary", "integer", "continuous"
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    rows: list[tuple[dict[int, float], str, float, str]] = field(default_factory=list)  # terms, sense, rhs, family
    objective: dict[int, float] = field(default_factory=dict)
    objective_constant: float = 0.0
    objective_divisor: float = 1.0
    time_unit_s: float = 1e-6  # time variables and constants are in microseconds (solver tolerances)
    assign: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, class) -> x variable
    layers: dict[tuple[int, object], int] = field(default_factory=dict)  # (stage, count or LayerMix) -> lambda
    classes: list[list[int]] = field(default_factory=list)
    config: Config | None = None

    def var(self, name: str, kind: str = "continuous", lower: float = 0.0, upper: float = INF) -> int:
        self.names.append(name)
        self.kinds.append(kind)
        self.lower.append(lower)
        self.upper.append(1.0 if kind == "binary" else upper)
        return len(self.names) - 1

    def add(self, terms: dict[int, float], sense: str, rhs: float, family: str) -> None:
        terms = {k: v for k, v in terms.items() if v != 0}
        if terms or not _holds(0.0, sense, rhs):
            self.rows.append((terms, sense, rhs, family))

    def tighten_upper_bounds(self, passes: int = 60) -> None:
        """Give every time variable the largest value any constraint can require of it (propagated through
        the constraints' other variables). Every time variable here is the maximum of its lower bounds and
        enters the objective with a positive weight, so no optimal solution needs more; CP-SAT needs the
        finite domains."""
        cont = [k == "continuous" for k in self.kinds]
        upper = [u if not c else 0.0 for u, c in zip(self.upper, cont)]
        for _ in range(passes):
            changed = False
            for terms, sense, rhs, _ in self.rows:
                if sense == "<=":
                    continue
                for v, coef in terms.items():
                    if not cont[v] or coef <= 0:
                        continue
                    need = rhs
                    for j, c in terms.items():
                        if j != v:
                            need -= c * (upper[j] if c < 0 else self.lower[j])
                    need /= coef
                    if need > upper[v] * (1 + 1e-12):
                        upper[v], changed = need, True
            if not changed:
                break
        else:
            return  # no fixpoint: keep the unbounded domains
        self.upper = [u * (1 + 1e-9) + 1.0 if c else u for u, c in zip(upper, cont)]

    def decode(self, values) -> Placement:
        """Placement from a solution vector: ranks take their class's GPUs in index order."""
        c = self.config
        free = [list(cls) for cls in self.classes]
        world = c.tp * c.pp * c.cp * c.dp
        gpus = [-1] * world
        for rank in range(world):
            cls = max(range(len(self.classes)), key=lambda u: values[self.assign[(rank, u)]]
                      if (rank, u) in self.assign else -1.0)
            gpus[rank] = free[cls].pop(0)
        layers = []
        for i in range(c.pp):
            options = [(values[v], q) for (stage, q), v in self.layers.items() if stage == i]
            chosen = max(options)[1]
            layers.append(getattr(chosen, "total", chosen))  # a count, or a LayerMix (docs/programs.md (P2b))
        return Placement.of(c, layers, gpus)


def _holds(lhs: float, sense: str, rhs: float) -> bool:
    return lhs >= rhs if sense == ">=" else lhs <= rhs if sense == "<=" else lhs == rhs
