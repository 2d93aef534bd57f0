//! How a script reaches Redis: each script's text and SHA1, and one call of it, ready to
//! send (EVALSHA, and EVAL with the text should the server answer NOSCRIPT).

use redis::{
    Arg, Cmd, ConnectionLike, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value,
};

/// A script of `lua/`: its text, and the SHA1 that EVALSHA names it by.
pub(crate) struct Lua {
    code: &'static str,
    hash: String,
}

impl Lua {
    pub(crate) fn new(code: &'static str) -> Lua {
        let hash = Script::new(code).get_hash().to_string();
        Lua { code, hash }
    }
}

/// One script call, ready to send: the EVALSHA, and the script's text should the server
/// not know it.
pub(crate) struct Call {
    script: Option<&'static Lua>,
    cmd: Cmd,
}

impl Call {
    pub(crate) fn new(script: &'static Lua, keys: &[&str], args: &[&str]) -> Call {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&script.hash).arg(keys.len()).arg(keys).arg(args);
        Call {
            script: Some(script),
            cmd,
        }
    }

    /// A plain command, no script.
    pub(crate) fn command(cmd: Cmd) -> Call {
        Call { script: None, cmd }
    }

    /// The request as bytes on the wire.
    pub(crate) fn packed(&self) -> Vec<u8> {
        self.cmd.get_packed_command()
    }

    /// Runs the call, sending the script's text if the server answers NOSCRIPT.
    pub(crate) fn run(&self, con: &mut dyn ConnectionLike) -> RedisResult<Value> {
        match self.cmd.query(con) {
            Err(e) if is_noscript(&e) => self.reload_and_run(con),
            result => result,
        }
    }

    /// After a NOSCRIPT answer: the same call as EVAL, with the script's text.
    pub(crate) fn reload_and_run(&self, con: &mut dyn ConnectionLike) -> RedisResult<Value> {
        self.eval().query(con)
    }

    /// The request as EVAL with the script's text, as bytes on the wire: for a request
    /// that must run whether or not the server knows the script.
    pub(crate) fn eval_packed(&self) -> Vec<u8> {
        self.eval().get_packed_command()
    }

    /// The call as EVAL with the script's text (a plain command stays as it is).
    fn eval(&self) -> Cmd {
        let Some(script) = self.script else {
            return self.cmd.clone();
        };
        let mut eval = redis::cmd("EVAL");
        eval.arg(script.code);
        // After EVALSHA and the hash: the key count, the keys, the arguments.
        for arg in self.cmd.args_iter().skip(2) {
            if let Arg::Simple(bytes) = arg {
                eval.arg(bytes);
            }
        }
        eval
    }
}

/// Whether the server did not know the script (restarted, or SCRIPT FLUSH).
pub(crate) fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}
