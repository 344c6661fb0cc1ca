# One command to a running course, one to the whole test suite.
#   make lab      set up .venv (first time) and open the course in JupyterLab
#   make test     set up .venv (first time), lint (ruff, lint-imports), and run every test and notebook
#   make student  write student notebooks (solutions removed) to student/
#   make figures  regenerate figures/ from the package
#   make notebooks  re-execute every notebook in place (after changing code)
#   make notebooks-portable  the notebooks under strict nbval with other CPU settings (no SIMD, AVX2, 1 thread)
#   make gpu-report  time and check everything on a CUDA GPU into figures/gpu/ (< 8 min; a dry run without one)
#                 offline GPU machine, its own python3, no install, the key numbers in < 4 min:
#                   PYTHONPATH=. python3 -m selfattn_lite.course.gpu_report --quick
#                 (= make gpu-report PYTHON=python3 INSTALL=no GPU_REPORT_ARGS=--quick)
#   make assignments  nbgrader course in assignments/ (source/ with grading metadata, release/)
#   make site     the course as an offline static website in _site/html (open index.html)
#   make explorer the live attention explorer as a Voila app
#   make badges   Binder/Colab badges and the Colab install cell in every notebook (then make notebooks)

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch build to install. torch==2.13.0 is the CPU build on the course's CI machine;
# on a laptop it is whatever PyPI serves for it (CUDA on Linux x86, MPS/CPU on macOS).
TORCH ?= torch==2.13.0
STAMP := $(VENV)/.selfattn-installed
LAB_ARGS ?=
# JupyterLab refuses to start as root (containers, CI boxes) unless told it may.
ROOT_ARGS := $(if $(filter 0,$(shell id -u)),--allow-root)
PYTEST_ARGS ?=
# Idle OpenMP threads sleep instead of spinning: fair timings on a shared or busy CPU.
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: install lab test student figures notebooks notebooks-portable gpu-report assignments site explorer badges clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[all]"
	touch $(STAMP)

install: $(STAMP)

lab: install
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks $(ROOT_ARGS) $(LAB_ARGS)

test: install
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest $(PYTEST_ARGS)

student: install
	$(PY) -m selfattn_lite.course.student notebooks student

figures: install
	$(PY) -m selfattn_lite.course.figures figures

notebooks: install
	cd notebooks && for nb in [0-9][0-9]_*.ipynb; do \
		../$(PY) -m jupyter nbconvert --to notebook --execute --inplace "$$nb" || exit 1; done

# The notebooks under strict nbval as other CPUs compute them: torch's generic kernels (no SIMD),
# AVX2 kernels (most laptops; this runs wherever the CPU has AVX2), and one thread. A committed output
# that rounding decides (an ulp-level error, the last digits of a threaded sum) differs under one of them.
PORTABLE_SETTINGS ?= ATEN_CPU_CAPABILITY=default ATEN_CPU_CAPABILITY=avx2 OMP_NUM_THREADS=1
notebooks-portable: install
	for setting in $(PORTABLE_SETTINGS); do echo "== notebooks with $$setting"; \
		env $$setting $(PY) -m pytest notebooks/ $(PYTEST_ARGS) || exit 1; done

# INSTALL=no: run with $(PYTHON) as it is, no venv, no pip (the offline GPU machine's own python3).
INSTALL ?= yes
REPORT_PY := $(if $(filter no,$(INSTALL)),$(PYTHON),$(PY))
gpu-report: $(if $(filter no,$(INSTALL)),,install)
	PYTHONPATH=.$(if $(PYTHONPATH),:$(PYTHONPATH)) $(REPORT_PY) -m selfattn_lite.course.gpu_report --out figures/gpu $(GPU_REPORT_ARGS)

assignments: install
	$(PY) -m selfattn_lite.course.assignments notebooks assignments

site: install
	$(PY) -m selfattn_lite.course.site _site

explorer: install
	$(PY) -m voila apps/explorer.ipynb $(LAB_ARGS)

badges: install
	$(PY) -m selfattn_lite.course.badges notebooks

clean:
	rm -rf $(VENV) student assignments _site .pytest_cache .ruff_cache .hypothesis
