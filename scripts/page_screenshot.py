"""A PNG of a memopt memory page as headless Chromium draws it, with the
pointer on a program's peak (its hover panel open).

    python scripts/page_screenshot.py out/memory.html docs/_static/memory_page_resnet50.png \
        [--lane 1] [--series 1] [--width 1400] [--height 1100]

``--lane`` / ``--series``: whose peak to hover (0-based, in page order).
The demo (scripts/demo.py) writes ``out/memory.html``; the docs' picture is
this script's output for it.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page")
    ap.add_argument("output")
    ap.add_argument("--lane", type=int, default=0)
    ap.add_argument("--series", type=int, default=1)
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1100)
    args = ap.parse_args()

    from selenium.webdriver.common.action_chains import ActionChains

    from browser import chromium, console_problems, open_page

    with chromium(args.width, args.height) as driver:
        open_page(driver, args.page)
        marker = driver.find_element("id", f"peak-{args.lane}-{args.series}")
        lane = driver.find_element("id", f"lane-{args.lane}")
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", lane)
        ActionChains(driver).move_to_element(marker).perform()
        problems = console_problems(driver)
        if problems:
            raise SystemExit(f"the page logged problems: {problems}")
        driver.save_screenshot(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
