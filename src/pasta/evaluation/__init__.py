"""Evaluation: decode the AlpacaEval prompts, score quality (alpaca_eval) and speed, and report.

Modules, one job each:
    dispatch    what `python -m pasta.eval` runs: the mode, the output folder, then the modules below
    config      the `eval:` config node (EvalConfig)
    run_files   the files of one evaluated run and their checked loading
    eval_set    the evaluated prompts (eval_data, a seeded eval.subset, eval.limit) and their AlpacaEval positions
    generation  decode the prompts of a run (async | sequential | sot), resumable
    sot         Skeleton-of-Thought prompting over the sequential decoder
    quality     win rate and length-controlled win rate through alpaca_eval
    judge_annotator a pasta judge as alpaca_eval's annotator, resumable
    annotations the alpaca_eval annotations: valid preferences, a checked annotations.json
    speed       per-answer speed (AnswerSpeed) and a run's speed (SpeedSummary): wall-clock, step, cost-model and
                theoretical speedups, bootstrap intervals; the one headline rule (the wall-clock speedup)
    structure   how the answers use PASTA-LANG: forks, promises, malformed output, chunk lengths, overruns
    proxies     offline quality guards: embedding similarity to the reference, distinct-2/3, length ratio
    scoring     score one run (quality + speed) and write its summary
    report      gathering: per-run summary files, the runs of a report as typed rows (ReportRow)
    formatting  how a person reads them: summary.md, report.md tables, the Pareto plot

The entry point is `python -m pasta.eval` (pasta/eval.py).
"""
