"""GraphPipe: graph pipeline parallelism (Jeon et al., ASPLOS 2025; docs/algorithms.md §5).

* :mod:`.sp`: series-parallel decomposition of the layer DAG (§3.3, §3.5);
* :mod:`.costs`: a stage's time per sample and memory (§3.2, §3.4);
* :mod:`.dp`: the DP over (SP subgraph, devices) and the binary search on the target TPS (§3.3, Alg. 1);
* :mod:`.stages`: stages to a validated plan of method ``graph``;
* :mod:`.planner`: :func:`plan_graphpipe`, the registry's ``graphpipe``;
* :mod:`.brute`: the exhaustive reference on small graphs.
"""

from pipetrain.planners.graphpipe.planner import GraphPipeReport, graphpipe_plans, plan_graphpipe

__all__ = ["GraphPipeReport", "graphpipe_plans", "plan_graphpipe"]
