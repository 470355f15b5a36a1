from starvecheck import entry

raise SystemExit(entry())
