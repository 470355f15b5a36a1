"""The trainers' callbacks: transformers' (hf.py) and Lightning's (pl.py), on the hooks
both share (hooks.py). Public as `starvecheck.integrations`; importing this package
imports neither trainer."""
