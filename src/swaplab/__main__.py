from swaplab.cli import main

raise SystemExit(main())
