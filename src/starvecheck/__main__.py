from starvecheck.cli import main

raise SystemExit(main())
