"""Parses its arguments, prints, and exits before any optimizer step (a wrong flag, say)."""

import argparse
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, required=True)
args = parser.parse_args()
print(f"loading data for batch {args.batch_size}")
print("no data found under ./data: giving up")
sys.exit(4)
