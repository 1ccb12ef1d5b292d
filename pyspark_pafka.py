"""Discovery shim: Spark imports top-level ``pyspark_*`` modules to find Python data sources."""
