"use strict";
(function () {
  var sent = false;
  document.querySelectorAll("form:not([data-passkey])").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (sent) event.preventDefault();
      sent = true;
    });
  });
  window.addEventListener("pageshow", function () { sent = false; });
})();
