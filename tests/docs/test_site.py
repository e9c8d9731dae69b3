"""The documentation site as readers get it: built by `mkdocs build --strict`, served over HTTP, rendered by
headless Chromium (driven over the DevTools protocol, tests/docs/siteutil.py).

It checks that the home page renders, that the navigation reaches every built page and that every page is at most
two clicks from home, that Material's search (its Web Worker and the index) finds the API's names, and that no page
logs a JavaScript error. No TensorFlow: .venv-docs holds the tools (`make docs`); skipped where they or Chromium
are missing. Nothing is written into the tree: the site is built under pytest's tmp_path.
"""

import html
import re
import shutil

import pytest

import siteutil


#: What a rendered page shows: its title, Material's header and navigation, the article, and the links a reader
#: sees (on a 1400x1000 window: the tabs, the current tab's sidebar, the article's links).
PAGE_INFO = """(() => {
  const visible = e => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== "hidden";
  const all = selector => [...document.querySelectorAll(selector)];
  const article = document.querySelector("article.md-content__inner") || document.querySelector("article");
  const h1 = article && article.querySelector("h1");
  return {
    title: document.title,
    header: !!document.querySelector("header.md-header"),
    navs: all("nav").filter(nav => nav.querySelector("a[href]")).length,
    tabs: all("nav.md-tabs a[href]").length,
    nav: all("nav.md-nav--primary a[href], nav.md-tabs a[href]").map(a => a.href),
    visible: all("nav.md-nav--primary a[href], nav.md-tabs a[href], article a[href]").filter(visible).map(a => a.href),
    article: article ? article.innerText.trim() : "",
    h1: h1 ? h1.innerText.replace(/\u00b6/g, "").trim() : "",
  };
})()"""

#: Material's search results, once its worker answered: the count line and each result's link and text.
SEARCH_RESULTS = """(() => {
  const items = [...document.querySelectorAll(".md-search-result__item")];
  const meta = document.querySelector(".md-search-result__meta");
  return items.length ? {
    meta: meta ? meta.innerText : "",
    items: items.map(item => ({href: (item.querySelector("a[href]") || {}).href || "", text: item.innerText})),
  } : null;
})()"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    executable = siteutil.find_chromium()
    if executable is None:
        pytest.skip(siteutil.NO_BROWSER)
    with siteutil.Chromium(executable, tmp_path_factory.mktemp("chromium")) as chromium:
        yield chromium


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    venv = siteutil.docs_venv()
    if not (venv / "bin" / "mkdocs").exists():
        pytest.skip(siteutil.NO_TOOLS)
    dest = tmp_path_factory.mktemp("docs") / "site"
    done = siteutil.build_site(venv, dest)
    if done.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed (exit {done.returncode}):\n{done.stdout}{done.stderr}",
                    pytrace=False)
    return dest


@pytest.fixture(scope="module")
def base_url(site):
    with siteutil.serve(site) as url:
        yield url


@pytest.fixture(scope="module")
def tab(browser):
    return browser.new_tab()


@pytest.fixture(scope="module")
def crawl(tab, site, base_url):
    """{page's URL path: PAGE_INFO + its errors} for home and every page reached through the navigation, breadth
    first, from the links the browser renders on each page."""
    pages, queue = {}, ["/"]
    while queue:
        path = queue.pop(0)
        if path in pages:
            continue
        tab.goto(base_url + path.lstrip("/"))
        info = tab.evaluate(PAGE_INFO)
        info["errors"] = tab.errors()
        pages[path] = info
        queue += [p for p in (siteutil.page_path(link, base_url) for link in info["nav"]) if p and p not in pages]
    return pages


def _links(info, base_url, key):
    return {p for p in (siteutil.page_path(link, base_url) for link in info[key]) if p}


def test_home_page_renders(crawl):
    home = crawl["/"]
    assert "hvd_sched" in home["title"], home["title"]
    assert home["header"], "no Material header (header.md-header) on the rendered home page"
    assert home["navs"] >= 2 and home["tabs"], f"expected the tabs and the sidebar navigation with links: {home}"
    assert home["article"], "the home page's article has no text"


def test_navigation_reaches_every_page(crawl, site):
    built = siteutil.built_pages(site)
    reached = set(crawl)
    assert reached == built, (f"built but not in the navigation: {sorted(built - reached)}; "
                              f"in the navigation but not built: {sorted(reached - built)}")
    empty = sorted(path for path, info in crawl.items() if not info["article"] or not info["h1"])
    assert not empty, f"pages without article text or an <h1> in the browser: {empty}"


def test_every_page_is_at_most_two_clicks_from_home(crawl, site, base_url):
    clicks = {"/": 0}
    for depth in (1, 2):
        for path in [p for p, n in clicks.items() if n == depth - 1 and p in crawl]:
            for target in _links(crawl[path], base_url, "visible"):
                clicks.setdefault(target, depth)
    far = sorted(siteutil.built_pages(site) - set(clicks))
    assert not far, f"more than two clicks from home (tabs, sidebar, article links): {far}"


@pytest.mark.parametrize("term", ["SCALE_MOMENTUM", "LauncherMismatchError"])
def test_search_finds(tab, site, base_url, term):
    # search.share: Material opens the search with the query of ?q= and runs it in its Web Worker.
    tab.goto(f"{base_url}?q={term}")
    found = tab.wait_for(SEARCH_RESULTS, timeout=30)
    meta = 'document.querySelector(".md-search-result__meta")?.innerText'
    assert found, f"no search results for {term!r} within 30 s; the result list says {tab.evaluate(meta)!r}"
    assert not tab.errors(), f"JavaScript errors with the search open: {tab.errors()}"
    pages = {siteutil.page_path(item["href"], base_url) for item in found["items"]}
    assert None not in pages, f"a search result leads off the site: {found['items']}"
    holding = [p for p in sorted(pages) if term in _text(siteutil.page_file(site, p))]
    assert holding, f"no result for {term!r} leads to a page that holds it: {found}"


def _text(page):
    """A built page's text, tags stripped."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text())) if page.exists() else ""


def test_no_javascript_errors(crawl):
    assert "/" in crawl
    errors = {path: info["errors"] for path, info in crawl.items() if info["errors"]}
    assert not errors, f"JavaScript errors, console errors or failed loads: {errors}"


def _copy_of_the_sources(dest):
    """What `mkdocs build` reads, copied (the hooks find hvd_sched beside themselves; examples/ is only read)."""
    for name in ("docs", "hvd_sched", "scripts"):
        shutil.copytree(siteutil.ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(siteutil.ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    (dest / "examples").symlink_to(siteutil.ROOT / "examples")


def _orphan_page(root):
    (root / "docs" / "how-to" / "orphan.md").write_text("# A page the navigation does not list\n")
    return "not included in the \"nav\" configuration"


def _broken_anchor(root):
    page = root / "docs" / "index.md"
    page.write_text(page.read_text() + "\nSee [the guard](how-to/launching.md#no-such-heading).\n")
    return "does not contain an anchor '#no-such-heading'"


def _undocumented_name(root):
    module = root / "hvd_sched" / "config.py"
    source = module.read_text()
    start = source.index('def linear_scaled_lr(')
    body = source.index('"""', start)
    end = source.index('"""', body + 3) + 3
    module.write_text(source[:body] + "pass" + source[end:])
    return "public names without a docstring"


@pytest.mark.parametrize("fault", [_orphan_page, _broken_anchor, _undocumented_name],
                         ids=["a page missing from the navigation", "a broken anchor", "a name without a docstring"])
def test_the_strict_build_fails_on(fault, tmp_path):
    """What `make docs` must refuse: each fault, put into a copy of the sources, stops the build with its reason."""
    venv = siteutil.docs_venv()
    if not (venv / "bin" / "mkdocs").exists():
        pytest.skip(siteutil.NO_TOOLS)
    _copy_of_the_sources(tmp_path)
    reason = fault(tmp_path)
    done = siteutil.build_site(venv, tmp_path / "site", root=tmp_path)
    assert done.returncode != 0 and reason in done.stdout + done.stderr, done.stdout + done.stderr
