"""The routing core, one module per job (docs/architecture.md): ``plan`` (step 1 and the
session's configuration reads), ``walk`` (the walk and the one exit), ``stream`` (the
stream over the walk), ``explain`` (read-only). :mod:`llm_routing.router` is its public
face; arrows point down: explain/stream → walk → plan."""
