"""Measured trials as slime jobs on a Ray cluster: the runner (runner; the job's watch with its limits in watch,
its TrialResult in summary), the parser of what a slime run prints (log), the fixed-length SFT row builder
(sft_rows) and the two files shipped to the job: the rollout function (pretokenized_sft_rollout) and the
peak-memory hook (hooks/peak_memory_hook)."""
