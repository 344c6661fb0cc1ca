"""The course machinery: benchmarks, the GPU report, training commands, the student build, assignments, site, badges, figures."""
