"""`specgen bench`: a request set served plain and speculative, side by side.

The logic only; the command and all rendering live in the CLI.
requests: the request file · configs: `--config` · models: loading (through
specgen.session) · runner: the sequential bench · sweep: the concurrency sweep ·
http, load: `--endpoint` (OpenAI-compatible servers over HTTP, load shapes) ·
records: record building, the record file, CSV · stats: every summary number.
"""

from specgen.bench.configs import PLAIN, Config, parse_config, parse_configs
from specgen.bench.setup import Setup, open_bench
from specgen.bench.records import CSV_COLUMNS, RecordFile, csv_rows, first_difference, request_record, write_csv
from specgen.bench.requests import Request, apply_chat_template, bundled_requests_text, load_requests, parse_requests
from specgen.bench.runner import WARMUP_TOKENS, Prepared, Runner, Settings, Timing, run_order
from specgen.bench.stats import (
    NOISE_BAND, bootstrap_ci, geomean, latency_summary, predict, predicted_speedup, summarize, summarize_sweep,
)
from specgen.bench.sweep import SweepRunner, check_concurrency, parse_concurrency

__all__ = [
    "CSV_COLUMNS", "NOISE_BAND", "PLAIN", "WARMUP_TOKENS",
    "Config", "Prepared", "RecordFile", "Request", "Runner", "Settings", "Setup", "SweepRunner", "Timing",
    "apply_chat_template", "bootstrap_ci", "bundled_requests_text", "check_concurrency", "csv_rows",
    "first_difference", "geomean", "latency_summary", "load_requests", "open_bench", "parse_concurrency", "parse_config",
    "parse_configs", "parse_requests", "predict", "predicted_speedup", "request_record", "run_order",
    "summarize", "summarize_sweep", "write_csv",
]
