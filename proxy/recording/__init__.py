"""What happens to an answered call: the call log, the writer thread that moves it into the
database as rows, trajectory stitching, interaction types, and the spool for the database's
outages."""
