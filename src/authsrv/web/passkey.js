"use strict";
(function () {
  function text(buffer) {
    return btoa(String.fromCharCode.apply(null, new Uint8Array(buffer)))
      .replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }
  function bytes(value) {
    return Uint8Array.from(atob(value.replace(/-/g, "+").replace(/_/g, "/")), function (c) { return c.charCodeAt(0); });
  }
  function answer(credential) {
    var response = credential.response;
    var json = {id: credential.id, rawId: text(credential.rawId), type: credential.type,
                clientExtensionResults: credential.getClientExtensionResults(),
                response: {clientDataJSON: text(response.clientDataJSON)}};
    if (credential.authenticatorAttachment) json.authenticatorAttachment = credential.authenticatorAttachment;
    if (response.attestationObject) {
      json.response.attestationObject = text(response.attestationObject);
      json.response.transports = response.getTransports ? response.getTransports() : [];
    } else {
      json.response.authenticatorData = text(response.authenticatorData);
      json.response.signature = text(response.signature);
      if (response.userHandle) json.response.userHandle = text(response.userHandle);
    }
    return JSON.stringify(json);
  }
  document.querySelectorAll("form[data-passkey]").forEach(function (form) {
    if (!window.PublicKeyCredential || !navigator.credentials) return;
    form.hidden = false;
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var options = JSON.parse(form.dataset.options);
      options.challenge = bytes(options.challenge);
      (options.allowCredentials || []).concat(options.excludeCredentials || []).forEach(function (c) {
        c.id = bytes(c.id);
      });
      var create = form.dataset.passkey === "create";
      if (create) options.user.id = bytes(options.user.id);
      var asked = create ? navigator.credentials.create({publicKey: options})
                         : navigator.credentials.get({publicKey: options});
      asked.then(function (credential) {
        form.elements.credential.value = answer(credential);
        form.submit();
      }, function () {
        form.querySelector("[role=status]").textContent = "No passkey was used. Try again, or use another way.";
      });
    });
  });
})();
