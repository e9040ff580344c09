# The browser page (docs/web.md). test_web_api.py: its routes and JSON on the
# bundled model (no browser). test_web_browser.py: the page in headless
# Chromium through chromedriver and Selenium on the real instruct model;
# skips (77, saying why) without Chromium, chromedriver, Selenium or the
# model (scripts/setup.sh --test installs the first three). Its screenshots
# go to web-artifacts/ in the build directory.
add_test(NAME web_api
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_web_api.py
          $<TARGET_FILE:cairn> ${CAIRN_MODEL})
set_tests_properties(web_api PROPERTIES TIMEOUT 300 LABELS "server")

add_test(NAME web_browser
  COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/test_web_browser.py
          $<TARGET_FILE:cairn>)
set_tests_properties(web_browser PROPERTIES TIMEOUT 300 LABELS "server;realmodel"
  ENVIRONMENT "CAIRN_CHAT_MODEL=${CAIRN_CHAT_MODEL};CAIRN_WEB_ARTIFACTS=${CMAKE_BINARY_DIR}/web-artifacts")
