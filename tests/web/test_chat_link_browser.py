"""
Linking a chat account in a real browser, on the demo's three processes
(L{test_chat_demo}): the link page's button posts the start form, and the
browser follows the redirect to the chat platform, which the page's
form-action must let through, and back.
"""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait
from test_browser import WAIT, _browser_installed, driver, sign_in  # noqa: F401  (fixtures)
from test_chat_demo import demo  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def test_the_link_pages_button_links_the_chat_account(demo, driver):  # noqa: F811
    base, app = demo
    driver.get(app + "/")
    sign_in(driver, "bob", "bob-password")
    WebDriverWait(driver, WAIT).until(expected_conditions.element_to_be_clickable((By.ID, "link-chat"))).click()
    WebDriverWait(driver, WAIT).until(lambda d: d.current_url == base + "/api/auth/link/chat")
    assert "Link your discord account" in driver.find_element(By.TAG_NAME, "h1").text
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(driver, WAIT).until(lambda d: d.current_url.startswith(base + "/api/auth/link/chat/callback?"))
    assert "80351110224678913" in driver.find_element(By.TAG_NAME, "main").text
    assert "is now linked" in driver.find_element(By.TAG_NAME, "main").text
