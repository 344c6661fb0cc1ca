# Sphinx configuration of the course website (built by `make site`: python -m selfattn_lite.course.site).
# Offline by design: notebooks are read with their committed outputs (never executed), MathJax is
# served from the site (sphinx-mathjax-offline), and nothing is loaded from a CDN.
project = "selfattn-course"
author = "the selfattn-course authors"
copyright = "the selfattn-course authors, MIT licence"

extensions = ["myst_nb", "sphinx-mathjax-offline"]
nb_execution_mode = "off"                       # committed outputs, exactly as CI checked them
nb_ipywidgets_js = {}                           # no widget JavaScript from a CDN (widgets need a kernel)
myst_enable_extensions = ["dollarmath", "amsmath", "html_image"]
myst_heading_anchors = 3
suppress_warnings = ["mystnb.unknown_mime_type", "myst.header"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]

html_theme = "sphinx_book_theme"
html_title = "selfattn-course"
html_static_path = ["_static"]
html_css_files = ["explorer.css"]
html_last_updated_fmt = None
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    "home_page_in_toc": True,
}
html_context = {"default_mode": "light"}      # an explicit mode: no "invalid theme mode" console error
mathjax3_config = {"tex": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]]}}
