"""Analyses that turn traces and model weights into tidy tables (pandas DataFrames).

lookahead    router lookahead recovery by distance, previous token, extra candidates
cosine       expert cosine, residual norm after mean subtraction, singular-value energy
gates        gate weight by slot, drop-weakest block error
union        MTP union over windows and the streaming-bound speedup bound
drafters     drafter acceptance (draft model, n-gram prompt lookup; self-draft hook)
calibration  predictor precision and claim probability q (reliability)
ledger       every claim of both seed documents vs our measurements, verdicts by a rule per row
tolerance    the practical tolerance per kind of quantity (one table)
uncertainty  the one bootstrap over prompts; interval tables (value, low, high, n_prompts)
workload     the reference model over a workload, teacher-forced and greedy (cached traces)
live         workload runs through the live engine: strata counters, LRU vs SLRU-cold
bounds       static / Belady bounds and hit curves (separate owner)
"""
