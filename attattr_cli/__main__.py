from attattr_cli.cli import main

main()
