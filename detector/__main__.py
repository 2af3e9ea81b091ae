from detector.app.cli import main_entry

main_entry()
