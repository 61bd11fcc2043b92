# Equivalence cases: the plan on N ranks vs one rank (see equivalence_main.cpp).
ctxrun_equivalence(EquivSingleRankMatchesItself   1 tiny 64  "dp=1")
ctxrun_equivalence(EquivDataParallel2             2 tiny 64  "dp=2")
