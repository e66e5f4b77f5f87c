"""python manage.py health-parse {dcgmi,nccl} FILE [--exit-code N] [--min-busbw GBPS] [--json-report FILE]"""
import json
import sys

from django.core.management.base import BaseCommand, CommandError

from hosts.gate import health


class Command(BaseCommand):
    help = ("Parse `dcgmi diag -j` or `all_reduce_perf` output as the release gate does and print the verdict as "
            "JSON: verdict pass|fail, per-GPU detail, reasons in the tool's own words. Exit status 0 on pass, 1 on "
            "fail.")

    def add_arguments(self, parser):
        parser.add_argument("tool", choices=["dcgmi", "nccl"])
        parser.add_argument("file", help="the tool's output; - reads standard input")
        parser.add_argument("--exit-code", type=int, help="the tool's exit status (dcgmi: 226 and 205 fail)")
        parser.add_argument("--min-busbw", type=float, help="nccl: large-message busbw threshold in GB/s")
        parser.add_argument("--json-report", help="nccl: the -J report file, read instead of the table")

    def handle(self, *args, **options):
        text = self._read(options["file"])
        if options["tool"] == "dcgmi":
            result = health.parse_dcgmi(text, options["exit_code"])
        else:
            report = self._read(options["json_report"]) if options["json_report"] else None
            result = health.parse_nccl(text, json_text=report, exit_code=options["exit_code"],
                                       min_busbw=options["min_busbw"])
        self.stdout.write(json.dumps(result, indent=2, sort_keys=True))
        if result["verdict"] != "pass":
            raise SystemExit(1)

    @staticmethod
    def _read(path: str) -> str:
        try:
            if path == "-":
                return sys.stdin.read()
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror}") from None
